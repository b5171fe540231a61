// One keep-alive HTTP/1.1 connection that sends POST /generate requests and times their tokens.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

namespace hyserve::bench {

using bench_clock = std::chrono::steady_clock;

struct request_result {
  bool ok = false;
  std::string error;           // set when !ok
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;   // tokens received (also counted for a request that failed mid-stream)
  double ttft_s = -1.0;        // streaming only: request sent -> first event carrying tokens
  double e2e_s = 0.0;          // request sent -> response complete
  std::vector<double> itl_s;   // streaming only: gap before each token after the first
  std::string finish_reason;   // meta_info.finish_reason.type when the server reported it
  std::vector<int32_t> output_ids;  // the generated tokens (multi-turn: the next turn resends them)
  int64_t cached_tokens = 0;        // meta_info.cached_tokens: prompt tokens served from the prefix cache
};

struct client_config {
  std::string host_header;  // Host: value
  std::string base_path;    // prepended to /generate and /health
  std::optional<std::string> api_key;
  double timeout_s = 120.0;
};

struct plain_response {
  std::string error;  // transport failure; empty when a response arrived
  unsigned status = 0;
  std::string body;
};

class connection {
 public:
  connection(boost::asio::any_io_executor ex, boost::asio::ip::tcp::resolver::results_type endpoints,
             const client_config& config);

  // Opens the connection; returns an error message, empty on success.
  boost::asio::awaitable<std::string> connect();

  // GET base_path + path with the whole body collected.
  boost::asio::awaitable<plain_response> get(std::string_view path);

  // Sends one /generate request (body is the JSON text). on_tokens is called with the number of
  // tokens of every event as it arrives (the whole count at the end without streaming).
  boost::asio::awaitable<request_result> generate(const std::string& body, bool stream, int64_t prompt_tokens,
                                                  const std::function<void(int64_t)>& on_tokens);

  void close();

 private:
  using body_callback = std::function<void(unsigned status, std::string_view data, bench_clock::time_point at)>;
  struct exchange_times {
    std::string error;
    unsigned status = 0;
    bench_clock::time_point sent{};
    bench_clock::time_point done{};
  };

  boost::asio::awaitable<void> round_trip(boost::beast::http::request<boost::beast::http::string_body>& req,
                                          exchange_times& out, const body_callback& on_body);
  std::string describe(const boost::system::error_code& ec, std::string_view what) const;
  void prepare(boost::beast::http::request<boost::beast::http::string_body>& req) const;

  boost::beast::tcp_stream stream_;
  boost::asio::ip::tcp::resolver::results_type endpoints_;
  client_config config_;
  boost::beast::flat_buffer buffer_;
  bool open_ = false;
};

}  // namespace hyserve::bench
