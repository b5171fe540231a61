#include "client.h"

#include <array>
#include <cstdio>
#include <limits>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/version.hpp>
#include <boost/json.hpp>

namespace hyserve::bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

constexpr auto kTuple = net::as_tuple(net::use_awaitable);

double seconds_between(bench_clock::time_point a, bench_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string clip(std::string_view text, size_t limit = 200) {
  if (text.size() <= limit) return std::string(text);
  return std::string(text.substr(0, limit)) + "...";
}

// A failure on a reused keep-alive connection before any response byte: the server may have
// closed it while idle, so the request is retried once on a fresh connection.
bool stale_connection(const boost::system::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
         ec == net::error::broken_pipe || ec == net::error::connection_aborted;
}

// The message of an {"error": {"message": ...}} body, else the body itself (shortened).
std::string error_message(std::string_view body) {
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(body, ec);
  if (!ec && v.is_object()) {
    const boost::json::value* err = v.get_object().if_contains("error");
    if (err != nullptr && err->is_object()) {
      const boost::json::value* msg = err->get_object().if_contains("message");
      if (msg != nullptr && msg->is_string()) return std::string(msg->get_string());
    }
    if (err != nullptr && err->is_string()) return std::string(err->get_string());
  }
  if (body.empty()) return "(empty body)";
  return clip(body);
}

// Splits an SSE byte stream into events and hands over the joined data lines of each.
class sse_reader {
 public:
  template <class F>
  void feed(std::string_view data, F&& on_event) {
    for (char c : data) {
      if (c != '\r') pending_.push_back(c);
    }
    size_t start = 0;
    for (;;) {
      const size_t end = pending_.find("\n\n", start);
      if (end == std::string::npos) break;
      std::string payload;
      bool has_data = false;
      size_t line_start = start;
      while (line_start < end) {
        size_t line_end = pending_.find('\n', line_start);
        if (line_end == std::string::npos || line_end > end) line_end = end;
        std::string_view line(pending_.data() + line_start, line_end - line_start);
        if (line.starts_with("data:")) {
          line.remove_prefix(5);
          if (line.starts_with(' ')) line.remove_prefix(1);
          if (has_data) payload.push_back('\n');
          payload.append(line);
          has_data = true;
        }
        line_start = line_end + 1;
      }
      if (has_data) on_event(std::string_view(payload));
      start = end + 2;
    }
    pending_.erase(0, start);
  }
  bool has_partial_event() const { return pending_.find_first_not_of('\n') != std::string::npos; }

 private:
  std::string pending_;
};

}  // namespace

connection::connection(net::any_io_executor ex, tcp::resolver::results_type endpoints, const client_config& config)
    : stream_(std::move(ex)), endpoints_(std::move(endpoints)), config_(config) {}

std::string connection::describe(const boost::system::error_code& ec, std::string_view what) const {
  std::string reason;
  if (ec == beast::error::timeout) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "timed out after %g s", config_.timeout_s);
    reason = buf;
  } else if (ec == http::error::end_of_stream || ec == net::error::eof || ec == http::error::partial_message) {
    reason = "connection closed by the server";
  } else {
    reason = ec.message();
  }
  return std::string(what) + ": " + reason;
}

void connection::close() {
  boost::system::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
  buffer_.clear();
  open_ = false;
}

net::awaitable<std::string> connection::connect() {
  if (open_) close();
  stream_.expires_after(std::chrono::duration_cast<bench_clock::duration>(std::chrono::duration<double>(config_.timeout_s)));
  auto [ec, endpoint] = co_await stream_.async_connect(endpoints_, kTuple);
  if (ec) {
    close();
    co_return describe(ec, "cannot connect to " + config_.host_header);
  }
  boost::system::error_code ignored;
  stream_.socket().set_option(tcp::no_delay(true), ignored);
  open_ = true;
  co_return std::string();
}

void connection::prepare(http::request<http::string_body>& req) const {
  req.set(http::field::host, config_.host_header);
  req.set(http::field::user_agent, "hyserve-bench");
  if (config_.api_key) req.set(http::field::authorization, "Bearer " + *config_.api_key);
  req.keep_alive(true);
  req.prepare_payload();
}

net::awaitable<void> connection::round_trip(http::request<http::string_body>& req, exchange_times& out,
                                            const body_callback& on_body) {
  const auto timeout =
      std::chrono::duration_cast<bench_clock::duration>(std::chrono::duration<double>(config_.timeout_s));
  for (int attempt = 0;; ++attempt) {
    const bool reused = open_;
    if (!open_) {
      out.error = co_await connect();
      if (!out.error.empty()) co_return;
    }
    out.sent = bench_clock::now();
    stream_.expires_after(timeout);
    auto [write_ec, written] = co_await http::async_write(stream_, req, kTuple);
    if (write_ec) {
      close();
      if (reused && attempt == 0 && stale_connection(write_ec)) continue;
      out.error = describe(write_ec, "sending the request");
      co_return;
    }

    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    stream_.expires_after(timeout);
    auto [header_ec, header_bytes] = co_await http::async_read_header(stream_, buffer_, parser, kTuple);
    if (header_ec) {
      close();
      if (reused && attempt == 0 && stale_connection(header_ec)) continue;
      out.error = describe(header_ec, "waiting for the response");
      co_return;
    }
    out.status = parser.get().result_int();

    std::array<char, 16384> chunk;
    while (!parser.is_done()) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      stream_.expires_after(timeout);
      auto [ec, n] = co_await http::async_read_some(stream_, buffer_, parser, kTuple);
      if (ec == http::error::need_buffer) ec = {};
      const size_t got = chunk.size() - parser.get().body().size;
      if (got > 0) on_body(out.status, std::string_view(chunk.data(), got), bench_clock::now());
      if (ec) {
        close();
        out.error = describe(ec, "reading the response");
        co_return;
      }
    }
    out.done = bench_clock::now();
    if (!parser.keep_alive()) close();
    co_return;
  }
}

net::awaitable<plain_response> connection::get(std::string_view path) {
  http::request<http::string_body> req{http::verb::get, config_.base_path + std::string(path), 11};
  prepare(req);
  plain_response res;
  exchange_times times;
  co_await round_trip(req, times, [&](unsigned, std::string_view data, bench_clock::time_point) { res.body.append(data); });
  res.error = std::move(times.error);
  res.status = times.status;
  co_return res;
}

net::awaitable<request_result> connection::generate(const std::string& body, bool stream, int64_t prompt_tokens,
                                                    const std::function<void(int64_t)>& on_tokens) {
  http::request<http::string_body> req{http::verb::post, config_.base_path + "/generate", 11};
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, stream ? "text/event-stream" : "application/json");
  req.body() = body;
  prepare(req);

  request_result result;
  result.prompt_tokens = prompt_tokens;
  exchange_times times;
  sse_reader sse;
  std::string raw;          // the body of a non-streamed or failed response
  std::string stream_error;  // the first problem seen in the event stream
  bool done_marker = false;
  bench_clock::time_point last_token{};

  auto on_event = [&](std::string_view payload, bench_clock::time_point now) {
    if (!stream_error.empty()) return;
    if (payload == "[DONE]") {
      done_marker = true;
      return;
    }
    if (done_marker) {
      stream_error = "event after data: [DONE]";
      return;
    }
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(payload, ec);
    if (ec || !v.is_object()) {
      stream_error = "malformed event: " + clip(payload);
      return;
    }
    const boost::json::object& obj = v.get_object();
    if (obj.contains("error")) {
      stream_error = "error event: " + error_message(payload);
      return;
    }
    int64_t fresh = 0;
    if (const auto* ids = obj.if_contains("new_ids"); ids != nullptr && ids->is_array()) {
      fresh = static_cast<int64_t>(ids->get_array().size());
      for (const auto& id : ids->get_array())
        if (id.is_int64()) result.output_ids.push_back(static_cast<int32_t>(id.get_int64()));
    } else if (const auto* all = obj.if_contains("output_ids"); all != nullptr && all->is_array()) {
      fresh = static_cast<int64_t>(all->get_array().size()) - result.output_tokens;
      result.output_ids.clear();
      for (const auto& id : all->get_array())
        if (id.is_int64()) result.output_ids.push_back(static_cast<int32_t>(id.get_int64()));
    } else {
      stream_error = "event without new_ids or output_ids: " + clip(payload);
      return;
    }
    if (const auto* meta = obj.if_contains("meta_info"); meta != nullptr && meta->is_object()) {
      if (const auto* c = meta->get_object().if_contains("cached_tokens"); c != nullptr && c->is_int64())
        result.cached_tokens = c->get_int64();
      const auto* reason = meta->get_object().if_contains("finish_reason");
      if (reason != nullptr && reason->is_object()) {
        const auto* type = reason->get_object().if_contains("type");
        if (type != nullptr && type->is_string()) result.finish_reason = std::string(type->get_string());
      }
    }
    if (fresh <= 0) return;
    if (result.output_tokens == 0) {
      result.ttft_s = seconds_between(times.sent, now);
    } else {
      // Several tokens in one event (speculative decoding) share the gap evenly.
      const double gap = seconds_between(last_token, now) / static_cast<double>(fresh);
      result.itl_s.insert(result.itl_s.end(), static_cast<size_t>(fresh), gap);
    }
    last_token = now;
    result.output_tokens += fresh;
    on_tokens(fresh);
  };

  co_await round_trip(req, times, [&](unsigned status, std::string_view data, bench_clock::time_point now) {
    if (status == 200 && stream) {
      sse.feed(data, [&](std::string_view payload) { on_event(payload, now); });
    } else {
      raw.append(data);
    }
  });

  if (!times.error.empty()) {
    result.error = times.error;
    co_return result;
  }
  result.e2e_s = seconds_between(times.sent, times.done);
  if (times.status != 200) {
    result.error = "HTTP " + std::to_string(times.status) + ": " + error_message(raw);
    co_return result;
  }
  if (stream) {
    if (!stream_error.empty()) {
      result.error = stream_error;
    } else if (!done_marker) {
      result.error = sse.has_partial_event() ? "stream ended inside an event" : "stream ended without data: [DONE]";
    } else if (result.output_tokens == 0) {
      result.error = "stream carried no tokens";
    } else {
      result.ok = true;
    }
    co_return result;
  }
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(raw, ec);
  const boost::json::value* ids = (!ec && v.is_object()) ? v.get_object().if_contains("output_ids") : nullptr;
  if (ids == nullptr || !ids->is_array()) {
    result.error = "malformed response (no output_ids array): " + clip(raw);
    co_return result;
  }
  result.output_tokens = static_cast<int64_t>(ids->get_array().size());
  for (const auto& id : ids->get_array())
    if (id.is_int64()) result.output_ids.push_back(static_cast<int32_t>(id.get_int64()));
  if (const auto* meta = v.get_object().if_contains("meta_info"); meta != nullptr && meta->is_object()) {
    if (const auto* c = meta->get_object().if_contains("cached_tokens"); c != nullptr && c->is_int64())
      result.cached_tokens = c->get_int64();
    const auto* reason = meta->get_object().if_contains("finish_reason");
    if (reason != nullptr && reason->is_object()) {
      const auto* type = reason->get_object().if_contains("type");
      if (type != nullptr && type->is_string()) result.finish_reason = std::string(type->get_string());
    }
  }
  on_tokens(result.output_tokens);
  result.ok = true;
  co_return result;
}

}  // namespace hyserve::bench
