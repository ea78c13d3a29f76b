// Remotes over libcurl. S3 requests are signed with libcurl's SigV4 (CURLOPT_AWS_SIGV4), which
// signs the URL as given: so keys are percent-encoded here, and the payload hash header that S3
// requires is added explicitly.
#include "data/remote.h"

#include <curl/curl.h>
#include <unistd.h>

#include <strings.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
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
  void fetch(const std::string& relative, const std::string& dest, const std::function<void(int64_t)>&) override {
    std::error_code ec;
    fs::copy_file(dir_ + "/" + relative, dest, fs::copy_options::overwrite_existing, ec);
    ANVIL_CHECK(!ec, "cannot copy '{}': {}", url(relative), ec.message());
  }
  bool exists(const std::string& relative) override { return fs::exists(fs::path(dir_) / relative); }
  void store(const std::string& src, const std::string& relative) override {
    const fs::path dest = fs::path(dir_) / relative, tmp = dest.string() + ".tmp";
    std::error_code ec;
    fs::create_directories(dest.parent_path(), ec);
    if (!ec) fs::copy_file(src, tmp, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(tmp, dest, ec);
    ANVIL_CHECK(!ec, "cannot store '{}' as '{}': {}", src, dest.string(), ec.message());
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

  void fetch(const std::string& relative, const std::string& dest,
             const std::function<void(int64_t)>& on_bytes) override {
    const std::string u = url(relative);
    const std::string error = retrying(u, [&] { return get(u, dest, on_bytes); });
    if (error.empty()) return;
    std::error_code ec;
    fs::remove(dest, ec);
    ANVIL_FAIL("cannot download {}: {}", u, error);
  }

  bool exists(const std::string& relative) override {
    const std::string u = url(relative);
    long status = 0;
    const std::string error = retrying(u, [&] {
      Attempt a = send("HEAD", u, "", 0, 0, nullptr);
      status = a.status;
      if (status == 404) a = {true, false, ""};
      return a;
    });
    ANVIL_CHECK(error.empty(), "cannot look for {}: {}", u, error);
    return status != 404;
  }

  void store(const std::string& src, const std::string& relative) override {
    ANVIL_CHECK(is_s3_, "cannot store '{}' at {}: an http(s) remote is read-only (store to s3:// or a directory)",
                src, url(relative));
    std::error_code ec;
    const int64_t size = static_cast<int64_t>(fs::file_size(src, ec));
    ANVIL_CHECK(!ec, "cannot store '{}': {}", src, ec.message());
    const std::string u = url(relative);
    if (size <= opt_.part_bytes) {
      const std::string error = retrying(u, [&] { return send("PUT", u, src, 0, size, nullptr); });
      ANVIL_CHECK(error.empty(), "cannot upload '{}' to {}: {}", src, u, error);
      return;
    }
    store_multipart(src, u, size);
  }

 private:
  struct Attempt {
    bool ok = false, retryable = false;
    std::string error;
    std::string body = {}, etag = {};  // of send(): the response's body and ETag header
    long status = 0;
  };

  // Runs attempt() until it succeeds, fails for good, or the retries are spent, waiting between
  // tries; returns "" or the last error.
  template <class F>
  std::string retrying(const std::string& u, F attempt_once) {
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
      const Attempt a = attempt_once();
      if (a.ok) return "";
      last_error = a.error;
      if (!a.retryable) break;
    }
    return last_error + (attempts > 1 ? fmt::format(" (after {} attempts)", attempts) : "");
  }

  // S3's multipart upload: initiate, the parts (each retried alone), complete; aborted on failure
  // so that no parts are left billed in the bucket.
  void store_multipart(const std::string& src, const std::string& u, int64_t size) {
    const int64_t part = std::max({opt_.part_bytes, int64_t{5} << 20, (size + 9999) / 10000});
    Attempt init;
    std::string error = retrying(u, [&] { return init = send("POST", u + "?uploads", "", 0, 0, nullptr); });
    ANVIL_CHECK(error.empty(), "cannot start the multipart upload of '{}' to {}: {}", src, u, error);
    const std::string upload_id = xml_value(init.body, "UploadId");
    ANVIL_CHECK(!upload_id.empty(), "cannot start the multipart upload of '{}' to {}: no UploadId in the answer", src,
                u);
    const std::string query = "uploadId=" + encode_key(upload_id);
    std::string complete = "<CompleteMultipartUpload>";
    for (int64_t offset = 0, number = 1; offset < size; offset += part, number++) {
      Attempt a;
      const std::string part_url = fmt::format("{}?partNumber={}&{}", u, number, query);
      error = retrying(u, [&] { return a = send("PUT", part_url, src, offset, std::min(part, size - offset), nullptr); });
      if (!error.empty() || a.etag.empty()) {
        send("DELETE", u + "?" + query, "", 0, 0, nullptr);
        ANVIL_FAIL("cannot upload part {} of '{}' to {}: {}", number, src, u, error.empty() ? "no ETag" : error);
      }
      complete += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", number, a.etag);
    }
    complete += "</CompleteMultipartUpload>";
    Attempt done;
    error = retrying(u, [&] {
      done = send("POST", u + "?" + query, "", 0, 0, &complete);
      // S3 may answer 200 with an error in the body.
      if (done.ok && done.body.find("<Error>") != std::string::npos) {
        done.ok = false;
        done.retryable = true;
        done.error = "the completion failed: " + xml_value(done.body, "Code");
      }
      return done;
    });
    if (!error.empty()) {
      send("DELETE", u + "?" + query, "", 0, 0, nullptr);
      ANVIL_FAIL("cannot complete the multipart upload of '{}' to {}: {}", src, u, error);
    }
  }

  static std::string xml_value(const std::string& xml, const std::string& tag) {
    const size_t b = xml.find("<" + tag + ">"), e = xml.find("</" + tag + ">");
    if (b == std::string::npos || e == std::string::npos || e < b) return "";
    return xml.substr(b + tag.size() + 2, e - b - tag.size() - 2);
  }

  // One signed request: method to u, with [offset, offset + length) of the file `src` as the
  // body (src not empty), or `text` (not null), or none; the answer's body and ETag kept.
  Attempt send(const char* method, const std::string& u, const std::string& src, int64_t offset, int64_t length,
               const std::string* text) {
    FILE* in = nullptr;
    if (!src.empty()) {
      in = std::fopen(src.c_str(), "rb");
      if (!in) return {false, false, fmt::format("cannot read '{}': {}", src, std::strerror(errno))};
      if (fseeko(in, offset, SEEK_SET) != 0) {
        std::fclose(in);
        return {false, false, fmt::format("cannot read '{}' at {}", src, offset)};
      }
    }
    Attempt a;
    CURL* c = curl_easy_init();
    curl_slist* headers = nullptr;
    char errbuf[CURL_ERROR_SIZE] = {0};
    const long timeout_ms = static_cast<long>(opt_.timeout_s * 1000);
    curl_easy_setopt(c, CURLOPT_URL, u.c_str());
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (in) {
      curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(c, CURLOPT_READDATA, in);
      curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(length));
    } else if (text) {
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, text->c_str());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(text->size()));
    } else if (std::strcmp(method, "POST") == 0) {
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(0));
    } else {
      curl_easy_setopt(c, CURLOPT_NOBODY, std::strcmp(method, "HEAD") == 0 ? 1L : 0L);
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append_to_string);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &a.body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, keep_etag);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &a.etag);
    // An upload's limit grows with its size: at least 1 MiB/s beyond the attempt's timeout.
    headers = common_options(c, errbuf, timeout_ms + static_cast<long>(length >> 10), headers);
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    const CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    a.status = status;
    curl_slist_free_all(headers);
    curl_easy_cleanup(c);
    if (in) std::fclose(in);
    if (rc != CURLE_OK) {
      a.retryable = rc != CURLE_READ_ERROR;
      a.error = errbuf[0] ? errbuf : curl_easy_strerror(rc);
      return a;
    }
    if (status >= 200 && status < 300) {
      a.ok = true;
      return a;
    }
    a.retryable = status >= 500 || status == 429 || status == 408;
    const std::string code = xml_value(a.body, "Code");
    a.error = fmt::format("HTTP {}{}{}", status, code.empty() ? "" : " " + code,
                          status == 403 ? " (access denied: check the credentials and the bucket's policy)" : "");
    return a;
  }

  static size_t append_to_string(char* p, size_t size, size_t n, void* user) {
    auto* s = static_cast<std::string*>(user);
    if (s->size() < (1 << 20)) s->append(p, size * n);  // answers are small XML documents
    return size * n;
  }
  static size_t keep_etag(char* p, size_t size, size_t n, void* user) {
    const std::string line(p, size * n);
    if (line.size() > 5 && strncasecmp(line.c_str(), "etag:", 5) == 0) {
      std::string v = line.substr(5);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.erase(v.begin());
      while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
      *static_cast<std::string*>(user) = v;
    }
    return size * n;
  }

  // What every request sets: its error buffer, no signals, the connect limit (at most 10 s) and
  // the transfer limit, the user agent, and the signature (sign).
  curl_slist* common_options(CURL* c, char* errbuf, long timeout_ms, curl_slist* headers) {
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::min<long>(static_cast<long>(opt_.timeout_s * 1000), 10'000));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "anvil");
    return sign(c, headers);
  }

  // SigV4 for S3 with credentials (the payload left unsigned, as S3 allows); anonymous otherwise.
  curl_slist* sign(CURL* c, curl_slist* headers) {
    if (!is_s3_ || !signed_) return headers;
    sigv4_ = "aws:amz:" + s3_.region + ":s3";
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, s3_.access_key.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, s3_.secret_key.c_str());
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!s3_.session_token.empty())
      headers = curl_slist_append(headers, ("x-amz-security-token: " + s3_.session_token).c_str());
    return headers;
  }

  static int report_bytes(void* user, curl_off_t, curl_off_t now, curl_off_t, curl_off_t) {
    (*static_cast<const std::function<void(int64_t)>*>(user))(static_cast<int64_t>(now));
    return 0;
  }

  Attempt get(const std::string& u, const std::string& dest, const std::function<void(int64_t)>& on_bytes) {
    FILE* f = std::fopen(dest.c_str(), "wb");
    if (!f) return {false, false, fmt::format("cannot write '{}': {}", dest, std::strerror(errno))};
    CURL* c = curl_easy_init();
    curl_slist* headers = nullptr;
    char errbuf[CURL_ERROR_SIZE] = {0};
    const long timeout_ms = static_cast<long>(opt_.timeout_s * 1000);
    curl_easy_setopt(c, CURLOPT_URL, u.c_str());
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_to_file);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
    if (on_bytes) {
      curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, report_bytes);
      curl_easy_setopt(c, CURLOPT_XFERINFODATA, &on_bytes);
    }
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    headers = common_options(c, errbuf, timeout_ms, headers);
    if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
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
  std::string sigv4_;  // CURLOPT_AWS_SIGV4's provider string, alive while a request runs
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
