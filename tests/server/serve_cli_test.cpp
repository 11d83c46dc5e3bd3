// `fireline serve` and `fireline stop` as a user runs them: the foreground server draining on
// SIGTERM, the daemon with its pid file and log, a real (tiny) model served, and start-up errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <thread>

#include "runtime/json_prefix.h"
#include "server_test_util.h"
#include "util/run_command.h"
#include "util/test_util.h"
#include "util/tiny_chat_model.h"

namespace fl::test {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// A child process running the fireline binary, with its stdout on a pipe.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      std::vector<char*> argv;
      std::string binary = fireline_binary();
      argv.push_back(binary.data());
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      _exit(127);
    }
    ::close(out[1]);
    out_ = out[0];
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
  }
  pid_t pid() const { return pid_; }

  // The next line of stdout (empty on timeout or end of output).
  std::string read_line(milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (buffer_.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      pollfd p{out_, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return {};
      char buf[1024];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) return {};
      buffer_.append(buf, static_cast<size_t>(n));
    }
    const size_t nl = buffer_.find('\n');
    std::string line = buffer_.substr(0, nl);
    buffer_.erase(0, nl + 1);
    return line;
  }

  // Exit status, or -1 when it is still running after `timeout`.
  int wait(milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() > deadline) return -1;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
  bool exited_ = false;
};

// True when nothing accepts connections on the port.
bool refused(int port) {
  const int fd = connect_local(port);
  if (fd >= 0) ::close(fd);
  return fd < 0;
}

int port_in(const std::string& text) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(R"(http://127\.0\.0\.1:(\d+))"))) return -1;
  return std::stoi(m[1]);
}

httplib::Client client_for(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  c.set_connection_timeout(2, 0);
  return c;
}

TEST(ServeCli, ServesAModelAndRefusesWhatItCannotServe) {
  // The tiny chat model (random weights, a real tokenizer and template) on the CPU: a chat, a
  // streamed chat and a completion come back well formed, and the model is named after its folder.
  TempDir dir;
  const std::string model = tiny::make_model_dir(dir.path() / "tiny-chat");
  Child server({"serve", model, "--port", "0", "--backend", "cpu", "--parallel", "2", "--max-seq", "256"});
  const std::string banner = server.read_line(milliseconds(30000));
  const int port = port_in(banner);
  ASSERT_GT(port, 0) << "banner: " << banner;
  EXPECT_NE(banner.find("tiny-chat on http://127.0.0.1:"), std::string::npos) << banner;
  EXPECT_NE(banner.find("(context 256, parallel 2)"), std::string::npos) << banner;
  auto client = client_for(port);

  json body = chat_body("Why is the sky blue?");
  body["max_tokens"] = 12;
  body["temperature"] = 0;
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json reply = json::parse(res->body);
  EXPECT_EQ(reply["model"], "tiny-chat");
  EXPECT_EQ(reply["usage"]["completion_tokens"].get<int>() <= 12, true);
  EXPECT_GT(reply["usage"]["prompt_tokens"].get<int>(), 5);
  const std::string finish = reply["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "length" || finish == "stop") << finish;

  // The same request streamed gives the same text (greedy), in pieces.
  body["stream"] = true;
  res = client.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::string streamed;
  for (const std::string& payload : sse_payloads(res->body)) {
    if (payload == "[DONE]") continue;
    const json chunk = json::parse(payload);
    if (!chunk["choices"].empty() && chunk["choices"][0]["delta"].contains("content"))
      streamed += chunk["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, reply["choices"][0]["message"]["content"].get<std::string>());

  // JSON mode: the answer is (a prefix of) one JSON object.
  json json_body = chat_body("Reply in JSON.");
  json_body["max_tokens"] = 16;
  json_body["response_format"] = {{"type", "json_object"}};
  res = client.Post("/v1/chat/completions", json_body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::string object = json::parse(res->body)["choices"][0]["message"]["content"];
  JsonPrefix prefix;
  EXPECT_TRUE(prefix.feed(object)) << object;
  EXPECT_EQ(object.find_first_not_of(" \t\r\n"), object.find('{')) << object;

  // A prompt longer than the context is a 400 that says so.
  json too_long = chat_body(std::string(2000, 'x'));
  res = client.Post("/v1/chat/completions", too_long.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;

  // Template variables from chat_template_kwargs that render no prompt at all, and a logit_bias
  // token the model does not have: 400s naming the field, not engine failures (500).
  json empty = chat_body("hi");
  empty["chat_template_kwargs"] = {{"messages", json::array()}, {"add_generation_prompt", false}, {"bos_token", ""}};
  res = client.Post("/v1/chat/completions", empty.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "messages") << res->body;
  json bias = chat_body("hi");
  bias["logit_bias"] = {{"100000000", 1}};
  res = client.Post("/v1/chat/completions", bias.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "logit_bias.100000000") << res->body;

  ::kill(server.pid(), SIGTERM);
  EXPECT_EQ(server.wait(milliseconds(10000)), 0);

  // What cannot be served fails at start with one clear line.
  auto r = run_command(shell_quote(fireline_binary()) + " serve no-such-model.fire --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no-such-model.fire: no such file or directory"), std::string::npos) << r.err;
  auto unknown = run_command(shell_quote(fireline_binary()) + " serve nosuchmodel --port 0");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("unknown model 'nosuchmodel' (see `fireline list`"), std::string::npos) << unknown.err;
  auto no_tokenizer = run_command(shell_quote(fireline_binary()) + " serve " +
                                  shell_quote(fixtures_dir() + "/gemma4-moe") + " --port 0 --backend cpu");
  EXPECT_EQ(no_tokenizer.exit_code, 1);
  EXPECT_NE(no_tokenizer.err.find("no tokenizer.json"), std::string::npos) << no_tokenizer.err;
  auto bad = run_command(shell_quote(fireline_binary()) + " serve --fake-engine --parallel 0 --port 0");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--parallel"), std::string::npos) << bad.err;
}

// A model split over ranks (--tp 2 --ep on CPU threads: model/tensor_parallel.h) serves what the
// one-device model serves: the same greedy completions, for Gemma 4's MoE and the Qwen3.5 MoE
// stored per expert, two requests at once (the batched step on the split model).
TEST(ServeCli, SplitModelsServeTheOneDeviceAnswers) {
  for (const char* fixture : {"gemma4-moe", "qwen35-moe-split"}) {
    SCOPED_TRACE(fixture);
    TempDir dir;
    const std::string model = tiny::make_model_dir(dir.path() / "tiny-chat", fixture);
    std::vector<std::string> answers;
    for (bool split : {false, true}) {
      std::vector<std::string> args = {"serve", model,        "--port", "0",         "--backend",
                                       "cpu",   "--parallel", "2",      "--max-seq", "256"};
      if (split) args.insert(args.end(), {"--tp", "2", "--ep"});
      Child server(args);
      const int port = port_in(server.read_line(milliseconds(30000)));
      ASSERT_GT(port, 0);
      std::vector<std::thread> clients;
      std::string replies[2];
      for (int i = 0; i < 2; ++i)
        clients.emplace_back([&, i] {
          auto client = client_for(port);
          // a plain completion: the random fixtures may end a chat turn at once, text goes on
          const json body = {{"prompt", i == 0 ? "The sky is blue because" : "Three colours: red,"},
                             {"max_tokens", 10},
                             {"temperature", 0}};
          auto res = client.Post("/v1/completions", body.dump(), "application/json");
          if (res && res->status == 200)
            replies[i] = json::parse(res->body)["choices"][0]["text"];
          else
            replies[i] = "(request failed)";
        });
      for (auto& c : clients) c.join();
      EXPECT_FALSE(replies[0].empty() || replies[1].empty()) << "split " << split;  // something to compare
      answers.push_back(replies[0] + "\n---\n" + replies[1]);
      ::kill(server.pid(), SIGTERM);
      EXPECT_EQ(server.wait(milliseconds(10000)), 0);
    }
    EXPECT_EQ(answers[1], answers[0]);
    EXPECT_EQ(answers[0].find("(request failed)"), std::string::npos) << answers[0];
  }
}

// The battery in CI against the built-in model on the CPU, counting only what a 14M-parameter
// model can satisfy: no empty answers, no repetition loops, no errors. A fixed server seed makes
// every answer the same from run to run (batched decode on the CPU equals decode alone).
TEST(ServeCli, BatteryAgainstTheBuiltInModel) {
  Child server({"serve", "--port", "0", "--backend", "cpu", "--parallel", "4", "--seed", "1"});
  const std::string banner = server.read_line(milliseconds(30000));
  const int port = port_in(banner);
  ASSERT_GT(port, 0) << "banner: " << banner;
  EXPECT_NE(banner.find("fireline-tiny on"), std::string::npos) << banner;
  auto r = run_command(shell_quote(fireline_binary()) + " battery http://127.0.0.1:" + std::to_string(port) +
                       " --max-tokens 64 --needle-words 300 --count empty,attractor");
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.exit_code, 0) << all;
  EXPECT_NE(all.find("turns=14 "), std::string::npos) << all;
  EXPECT_NE(all.find("empty=0 attractor=0"), std::string::npos) << all;
  EXPECT_NE(all.find("errors=0"), std::string::npos) << all;
  ::kill(server.pid(), SIGTERM);
  EXPECT_EQ(server.wait(milliseconds(10000)), 0);
}

TEST(ServeCli, SigtermDrainsTheStreamInFlightThenExits) {
  Child server({"serve", "--fake-engine", "--port", "0", "--fake-token-ms", "20"});
  const std::string banner = server.read_line(milliseconds(10000));
  const int port = port_in(banner);
  ASSERT_GT(port, 0) << "banner: " << banner;

  // A ~1 s stream (50 tokens x 20 ms); SIGTERM arrives once it has started.
  std::atomic<bool> streaming{false};
  std::string body;
  int status = -1;
  std::thread client([&] {
    auto c = client_for(port);
    json req = chat_body("[[long]]", true);
    req["max_tokens"] = 50;
    httplib::Request r;
    r.method = "POST";
    r.path = "/v1/chat/completions";
    r.body = req.dump();
    r.set_header("Content-Type", "application/json");
    r.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      body.append(data, n);
      streaming = true;
      return true;
    };
    if (auto res = c.send(r)) status = res->status;
  });
  ASSERT_TRUE(TestServer::eventually([&] { return streaming.load(); }, milliseconds(10000)));
  ASSERT_EQ(::kill(server.pid(), SIGTERM), 0);
  // New connections are refused once draining has begun.
  EXPECT_TRUE(TestServer::eventually([&] { return refused(port); }, milliseconds(2000)));
  client.join();
  EXPECT_EQ(status, 200);
  auto payloads = sse_payloads(body);
  ASSERT_FALSE(payloads.empty());
  EXPECT_EQ(payloads.back(), "[DONE]") << "the stream was cut off: "
                                       << body.substr(body.size() > 300 ? body.size() - 300 : 0);
  int tokens = 0;
  std::string finish;
  for (const auto& p : payloads) {
    if (p == "[DONE]") continue;
    json c = json::parse(p);
    const json& delta = c["choices"][0]["delta"];
    if (delta.contains("content") && !delta["content"].get<std::string>().empty()) ++tokens;
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(tokens, 50);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(server.wait(milliseconds(10000)), 0) << "the server did not exit cleanly";
}

TEST(ServeCli, DrainTimeoutCancelsWhatIsStillRunning) {
  Child server({"serve", "--fake-engine", "--port", "0", "--fake-token-ms", "20", "--drain-timeout", "0.5"});
  const int port = port_in(server.read_line(milliseconds(10000)));
  ASSERT_GT(port, 0);
  std::atomic<bool> streaming{false};
  std::string body;
  std::thread client([&] {
    auto c = client_for(port);
    httplib::Request r;
    r.method = "POST";
    r.path = "/v1/chat/completions";
    r.body = chat_body("[[long]]", true).dump();  // ~4000 tokens: far longer than the drain timeout
    r.set_header("Content-Type", "application/json");
    r.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      body.append(data, n);
      streaming = true;
      return true;
    };
    c.send(r);
  });
  ASSERT_TRUE(TestServer::eventually([&] { return streaming.load(); }, milliseconds(10000)));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(server.pid(), SIGTERM), 0);
  EXPECT_EQ(server.wait(milliseconds(10000)), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  client.join();
  // The stream ends with an error event saying why, not a silent cut.
  auto payloads = sse_payloads(body);
  ASSERT_FALSE(payloads.empty());
  json last = json::parse(payloads.back(), nullptr, false);
  ASSERT_FALSE(last.is_discarded()) << payloads.back();
  EXPECT_EQ(last["error"]["code"], "shutting_down") << payloads.back();
}

// Stops whatever daemon a test started in `home`, even when the test failed half way.
struct StopDaemonAtExit {
  const TempDir& home;
  ~StopDaemonAtExit() {
    run_command("FIRELINE_HOME=" + shell_quote(home.path().string()) + " " + shell_quote(fireline_binary()) +
                " stop --timeout 10");
  }
};

TEST(ServeCli, DetachPidFileAndStop) {
  TempDir home;
  StopDaemonAtExit cleanup{home};
  const std::string env = "FIRELINE_HOME=" + shell_quote(home.path().string()) + " ";
  const std::string bin = shell_quote(fireline_binary());
  auto started = run_command(env + bin + " serve --fake-engine --port 0 -d");
  ASSERT_EQ(started.exit_code, 0) << started.err;
  EXPECT_NE(started.out.find("fireline stop"), std::string::npos) << started.out;
  const int port = port_in(started.out);
  ASSERT_GT(port, 0) << started.out;
  const auto pid_file = home.path() / "serve.pid";
  ASSERT_TRUE(std::filesystem::exists(pid_file));
  ASSERT_TRUE(std::filesystem::exists(home.path() / "serve.log"));

  auto health = client_for(port).Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto chat = client_for(port).Post("/v1/chat/completions", chat_body("daemon").dump(), "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(json::parse(chat->body)["choices"][0]["message"]["content"], "You said: daemon");

  auto second = run_command(env + bin + " serve --fake-engine --port 0 -d");
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.err.find("already running"), std::string::npos) << second.err;

  auto stopped = run_command(env + bin + " stop");
  EXPECT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_NE(stopped.out.find("stopped the fireline server"), std::string::npos) << stopped.out;
  EXPECT_FALSE(std::filesystem::exists(pid_file));
  EXPECT_TRUE(refused(port)) << "still listening after stop";

  auto again = run_command(env + bin + " stop");
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_NE(again.out.find("no fireline server is running"), std::string::npos) << again.out;
}

TEST(ServeCli, DetachReportsBindFailures) {
  TestServer occupying;  // holds a port
  TempDir home;
  StopDaemonAtExit cleanup{home};  // in case it started after all
  auto r = run_command("FIRELINE_HOME=" + shell_quote(home.path().string()) + " " + shell_quote(fireline_binary()) +
                       " serve --fake-engine -d --port " + std::to_string(occupying.port()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot listen"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(home.path() / "serve.pid"));
}

}  // namespace
}  // namespace fl::test
