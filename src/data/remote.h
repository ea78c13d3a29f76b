// Fetching dataset files from where they live, and storing checkpoints there: a local directory
// (or file://), http(s)://, or s3://bucket/prefix (SigV4-signed through libcurl; endpoint, region
// and credentials from the usual AWS variables and files). Failures that may pass (connection
// errors, timeouts, 5xx, 429, short reads) are retried with exponential backoff and jitter; the
// rest fail at once with the URL and the server's answer.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace anvil {

struct RemoteOptions {
  int retries = 2;             // attempts after the first
  double timeout_s = 60;       // one attempt's limit (connecting and transferring)
  double backoff_s = 0.25;     // first retry's delay; doubles each attempt, plus up to as much jitter
  // store(): a file larger than this goes to S3 as a multipart upload of parts this large (at
  // least S3's 5 MiB; more when the file would need over 10,000 parts), each retried alone.
  int64_t part_bytes = int64_t{64} << 20;
};

class Remote {
 public:
  virtual ~Remote() = default;
  // Copies `relative` (e.g. "index.json") into the file `dest`, replacing it. on_bytes (when
  // given) hears how many bytes of the attempt in progress have arrived, as they arrive.
  virtual void fetch(const std::string& relative, const std::string& dest,
                     const std::function<void(int64_t)>& on_bytes = {}) = 0;
  // Copies the file `src` to `relative`, replacing it; the object appears whole or not at all
  // (S3, and a local directory by rename). http(s):// remotes are read-only.
  virtual void store(const std::string& src, const std::string& relative) = 0;
  // Whether `relative` exists (an error other than its absence is thrown).
  virtual bool exists(const std::string& relative) = 0;
  virtual std::string url(const std::string& relative) const = 0;
};

// Whether `location` names a remote (s3://, http://, https://) rather than a local path.
bool is_remote_url(const std::string& location);

// A remote for s3://, http(s)://, file:// or a plain directory path.
std::unique_ptr<Remote> open_remote(const std::string& location, const RemoteOptions& opt);

}  // namespace anvil
