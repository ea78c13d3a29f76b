// Fetching dataset files from where they live: a local directory (or file://), http(s)://, or
// s3://bucket/prefix (SigV4-signed through libcurl; endpoint, region and credentials from the
// usual AWS variables and files). Failures that may pass (connection errors, timeouts, 5xx, 429,
// short reads) are retried with exponential backoff and jitter; the rest fail at once with the
// URL and the server's answer.
#pragma once
#include <memory>
#include <string>

namespace anvil {

struct RemoteOptions {
  int retries = 2;             // attempts after the first
  double timeout_s = 60;       // one attempt's limit (connecting and transferring)
  double backoff_s = 0.25;     // first retry's delay; doubles each attempt, plus up to as much jitter
};

class Remote {
 public:
  virtual ~Remote() = default;
  // Copies `relative` (e.g. "index.json") into the file `dest`, replacing it.
  virtual void fetch(const std::string& relative, const std::string& dest) = 0;
  virtual std::string url(const std::string& relative) const = 0;
};

// Whether `location` names a remote (s3://, http://, https://) rather than a local path.
bool is_remote_url(const std::string& location);

// A remote for s3://, http(s)://, file:// or a plain directory path.
std::unique_ptr<Remote> open_remote(const std::string& location, const RemoteOptions& opt);

}  // namespace anvil
