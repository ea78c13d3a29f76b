// Remotes over libcurl. S3 requests are signed with libcurl's SigV4 (CURLOPT_AWS_SIGV4), which
// signs the URL as given: so keys are percent-encoded here, and the payload hash header that S3
// requires is added explicitly.
#include "data/remote.h"

#include <curl/curl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace anvil {
namespace fs = std::filesystem;
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string home_file(const std::string& override_var, const std::string& rel) {
  std::string p = env(override_var.c_str());
  if (!p.empty()) return p;
  const std::string home = env("HOME");
  return home.empty() ? "" : home + "/" + rel;
}

// Reads key `key` of section `section` from an AWS-style INI file ("" if absent).
std::string ini_value(const std::string& path, const std::string& section, const std::string& key) {
  std::ifstream in(path);
  std::string line, current;
  auto trim = [](std::string s) {
    const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      current = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const size_t eq = line.find('=');
    if (eq != std::string::npos && current == section && trim(line.substr(0, eq)) == key)
      return trim(line.substr(eq + 1));
  }
  return "";
}

// S3 object keys in a URL path: everything outside the unreserved set (and '/') percent-encoded,
// as the SigV4 canonical request expects.
std::string encode_key(const std::string& key) {
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') out += static_cast<char>(c);
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

size_t write_to_file(char* p, size_t size, size_t n, void* user) { return std::fwrite(p, size, n, static_cast<FILE*>(user)); }

struct S3Settings {
  std::string bucket, prefix, endpoint, region, access_key, secret_key, session_token;
};

S3Settings s3_settings(const std::string& location) {
  S3Settings s;
  const std::string rest = location.substr(5);
  const size_t slash = rest.find('/');
  s.bucket = rest.substr(0, slash);
  ANVIL_CHECK(!s.bucket.empty(), "'{}': expected s3://bucket/prefix", location);
  s.prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (!s.prefix.empty() && s.prefix.back() == '/') s.prefix.pop_back();
  const std::string profile = env("AWS_PROFILE").empty() ? "default" : env("AWS_PROFILE");
  const std::string config = home_file("AWS_CONFIG_FILE", ".aws/config");
  const std::string config_section = profile == "default" ? "default" : "profile " + profile;
  for (const char* v : {"S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"})
    if (s.endpoint.empty()) s.endpoint = env(v);
  if (s.endpoint.empty()) s.endpoint = ini_value(config, config_section, "endpoint_url");
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  s.region = env("AWS_REGION");
  if (s.region.empty()) s.region = env("AWS_DEFAULT_REGION");
  if (s.region.empty()) s.region = ini_value(config, config_section, "region");
  if (s.region.empty()) s.region = "us-east-1";
  s.access_key = env("AWS_ACCESS_KEY_ID");
  s.secret_key = env("AWS_SECRET_ACCESS_KEY");
  s.session_token = env("AWS_SESSION_TOKEN");
  if (s.access_key.empty()) {
    const std::string creds = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    s.access_key = ini_value(creds, profile, "aws_access_key_id");
    s.secret_key = ini_value(creds, profile, "aws_secret_access_key");
    s.session_token = ini_value(creds, profile, "aws_session_token");
  }
  ANVIL_CHECK(s.access_key.empty() == s.secret_key.empty(), "S3 credentials for '{}' are incomplete: an access key "
              "id needs its secret access key (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or ~/.aws/credentials)",
              location);
  return s;
}

class LocalRemote final : public Remote {
 public:
  explicit LocalRemote(std::string dir) : dir_(std::move(dir)) {}
  void fetch(const std::string& relative, const std::string& dest) override {
    std::error_code ec;
    fs::copy_file(dir_ + "/" + relative, dest, fs::copy_options::overwrite_existing, ec);
    ANVIL_CHECK(!ec, "cannot copy '{}': {}", url(relative), ec.message());
  }
  std::string url(const std::string& relative) const override { return dir_ + "/" + relative; }

 private:
  std::string dir_;
};

class CurlRemote final : public Remote {
 public:
  CurlRemote(const std::string& location, const RemoteOptions& opt) : opt_(opt) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    if (location.rfind("s3://", 0) == 0) {
      s3_ = s3_settings(location);
      signed_ = !s3_.access_key.empty();
      base_ = s3_.endpoint.empty() ? fmt::format("https://{}.s3.{}.amazonaws.com", s3_.bucket, s3_.region)
                                   : s3_.endpoint + "/" + s3_.bucket;
      if (!s3_.prefix.empty()) base_ += fmt::format("/{}", encode_key(s3_.prefix));
      is_s3_ = true;
    } else {
      base_ = location;
      while (!base_.empty() && base_.back() == '/') base_.pop_back();
    }
  }

  std::string url(const std::string& relative) const override {
    return base_ + "/" + (is_s3_ ? encode_key(relative) : relative);
  }

  void fetch(const std::string& relative, const std::string& dest) override {
    const std::string u = url(relative);
    std::mt19937_64 jitter(std::random_device{}());
    std::string last_error;
    int attempts = 0;
    for (int attempt = 0; attempt <= opt_.retries; attempt++) {
      attempts++;
      if (attempt > 0) {
        const double base = opt_.backoff_s * static_cast<double>(1 << std::min(attempt - 1, 16));
        const double wait = base + std::uniform_real_distribution<double>(0, base)(jitter);
        log_file_only(fmt::format("retrying {} in {:.2f} s after: {}", u, wait, last_error));
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      }
      const Attempt a = get(u, dest);
      if (a.ok) return;
      last_error = a.error;
      if (!a.retryable) break;
    }
    std::error_code ec;
    fs::remove(dest, ec);
    ANVIL_FAIL("cannot download {}: {}{}", u, last_error, attempts > 1 ? fmt::format(" (after {} attempts)", attempts) : "");
  }

 private:
  struct Attempt {
    bool ok = false, retryable = false;
    std::string error;
  };

  Attempt get(const std::string& u, const std::string& dest) {
    FILE* f = std::fopen(dest.c_str(), "wb");
    if (!f) return {false, false, fmt::format("cannot write '{}': {}", dest, std::strerror(errno))};
    CURL* c = curl_easy_init();
    curl_slist* headers = nullptr;
    char errbuf[CURL_ERROR_SIZE] = {0};
    const long timeout_ms = static_cast<long>(opt_.timeout_s * 1000);
    curl_easy_setopt(c, CURLOPT_URL, u.c_str());
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_to_file);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::min<long>(timeout_ms, 10'000));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "anvil");
    if (is_s3_ && signed_) {
      const std::string sigv4 = "aws:amz:" + s3_.region + ":s3";
      curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(c, CURLOPT_USERNAME, s3_.access_key.c_str());
      curl_easy_setopt(c, CURLOPT_PASSWORD, s3_.secret_key.c_str());
      headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
      if (!s3_.session_token.empty())
        headers = curl_slist_append(headers, ("x-amz-security-token: " + s3_.session_token).c_str());
      curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    }
    const CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_off_t expected = -1, got = 0;
    curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &expected);
    curl_easy_getinfo(c, CURLINFO_SIZE_DOWNLOAD_T, &got);
    curl_slist_free_all(headers);
    curl_easy_cleanup(c);
    const bool write_ok = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
    std::fclose(f);
    if (rc != CURLE_OK)
      return {false, rc != CURLE_WRITE_ERROR, fmt::format("{}", errbuf[0] ? errbuf : curl_easy_strerror(rc))};
    if (!write_ok) return {false, false, fmt::format("cannot write '{}'", dest)};
    if (status >= 200 && status < 300) {
      if (expected >= 0 && got != expected)
        return {false, true, fmt::format("short read: {} of {} bytes", got, expected)};
      return {true, false, ""};
    }
    // An error status: the body is the server's explanation (S3 sends XML with a Code).
    std::string body;
    {
      std::ifstream in(dest, std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      body = ss.str().substr(0, 300);
    }
    std::string reason;
    const size_t b = body.find("<Code>"), e = body.find("</Code>");
    if (b != std::string::npos && e != std::string::npos) reason = fmt::format(" {}", std::string_view(body).substr(b + 6, e - b - 6));
    const bool retryable = status >= 500 || status == 429 || status == 408;
    const char* hint = status == 404 ? " (no such file on the remote)"
                       : status == 403 ? " (access denied: check the credentials and the bucket's policy)"
                                       : "";
    return {false, retryable, fmt::format("HTTP {}{}{}", status, reason, hint)};
  }

  RemoteOptions opt_;
  S3Settings s3_;
  std::string base_;
  bool is_s3_ = false, signed_ = false;
};

}  // namespace

bool is_remote_url(const std::string& location) {
  return location.rfind("s3://", 0) == 0 || location.rfind("http://", 0) == 0 || location.rfind("https://", 0) == 0;
}

std::unique_ptr<Remote> open_remote(const std::string& location, const RemoteOptions& opt) {
  if (is_remote_url(location)) return std::make_unique<CurlRemote>(location, opt);
  ANVIL_CHECK(location.find("://") == std::string::npos || location.rfind("file://", 0) == 0,
              "remote '{}' has an unsupported scheme (expected s3://, http://, https://, file:// or a path)", location);
  std::string dir = location.rfind("file://", 0) == 0 ? location.substr(7) : location;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return std::make_unique<LocalRemote>(dir);
}

}  // namespace anvil
