// Policy-model throughput on any device, without Node (for the GPU check,
// scripts/gpu-check.sh, and for CPU comparisons): a randomly initialised
// model of a given shape, then
//   decode tokens/s at each batch size: B paths, each prefilled with a random
//     prompt (not timed), then `steps` greedy extend() calls of one token per
//     path, each returning its tokens to the host (so each step is synchronous);
//   train tokens/s: train_step (policy loss, AdamW; bf16 keeps float32 master
//     weights) on `train_seqs` sequences of `train_len` tokens.
// Warm-up calls precede every timing. Prints one JSON object per line:
//   {"what":"decode","model":"qwen2-0.5b","device":"cuda:0","dtype":"bfloat16","batch":64,"tokens_per_s":...,"ms_per_step":...}
//
//   model_bench [--model qwen2-0.5b|tiny] [--device cpu|cuda:N] [--dtype float32|bfloat16]
//               [--batches 1,64] [--steps 32] [--prompt 64] [--train-seqs 8] [--train-len 512]
//               [--train-steps 3] [--threads 0] [--no-train] [--no-decode]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test/torch/tiny_model.h"
#include "torch/compat.h"
#include "torch/device.h"
#include "torch/engine.h"
#include "torch/trainer.h"

using namespace arpo::model;
namespace K = arpo::kernels;
using arpo_test::random_tokens;

namespace {

ModelConfig model_config(const std::string& name) {
  ModelConfig c;
  c.model_type = "qwen2";
  if (name == "qwen2-0.5b") {  // Qwen2.5-0.5B's shape
    c.vocab_size = 151936;
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 14;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 32768;
    c.rope_theta = 1000000.0;
    c.tie_word_embeddings = true;
  } else if (name == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 4096;
  } else if (name == "demo") {  // the demo's decoder (lib/cli/demo.ts demoModelConfig, its vocabulary of ~1,200)
    c.model_type = "qwen3";
    c.vocab_size = 1206;
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 16;
    c.max_position_embeddings = 2048;
    c.tie_word_embeddings = true;
  } else {
    throw ModelError("--model: expected qwen2-0.5b, demo or tiny but received \"" + name + "\"");
  }
  c.qkv_bias = c.model_type == "qwen2";
  c.validate();
  return c;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "qwen2-0.5b", device_arg = "cpu", dtype_arg = "float32";
  std::vector<int> batches = {1, 64};
  int steps = 32, prompt = 64, train_seqs = 8, train_len = 512, train_steps = 3, threads = 0;
  bool do_train = true, do_decode = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "model_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") model_name = next();
    else if (a == "--device") device_arg = next();
    else if (a == "--dtype") dtype_arg = next();
    else if (a == "--batches") batches = parse_list(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--prompt") prompt = std::stoi(next());
    else if (a == "--train-seqs") train_seqs = std::stoi(next());
    else if (a == "--train-len") train_len = std::stoi(next());
    else if (a == "--train-steps") train_steps = std::stoi(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--no-train") do_train = false;
    else if (a == "--no-decode") do_decode = false;
    else {
      std::fprintf(stderr, "model_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    arpo::compat::set_compute_threads(threads);
    const ModelConfig c = model_config(model_name);
    const at::Device device = parse_device(device_arg, "--device");
    const at::ScalarType dtype = parse_dtype(dtype_arg);
    Model model(c, dtype, device);
    model.init_weights(1);
    const std::string head = "{\"model\":\"" + model_name + "\",\"device\":\"" + device_name(device) + "\",\"dtype\":\"" +
                             dtype_arg + "\",\"parameters\":" + std::to_string(model.num_parameters());
    if (do_decode) {
      K::SamplingParams greedy;
      greedy.temperature = 0.0f;
      for (int B : batches) {
        Engine engine(model, KVCache::Options{16, 64, 0}, threads);
        std::vector<int32_t> paths;
        std::vector<std::vector<int32_t>> inputs;
        for (int b = 0; b < B; ++b) {
          paths.push_back(engine.cache().new_path(static_cast<uint64_t>(b)));
          inputs.push_back(random_tokens(prompt, c.vocab_size, 100 + b));
        }
        DecodeResult r = engine.extend(paths, inputs, greedy);  // prefill
        auto step = [&] {
          for (int b = 0; b < B; ++b) inputs[b] = {r.tokens[b]};
          r = engine.extend(paths, inputs, greedy);
        };
        for (int w = 0; w < 2; ++w) step();
        const auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < steps; ++s) step();
        const double sec = seconds_since(t0);
        std::printf("%s,\"what\":\"decode\",\"batch\":%d,\"steps\":%d,\"tokens_per_s\":%.2f,\"ms_per_step\":%.3f}\n",
                    head.c_str(), B, steps, B * steps / sec, 1000.0 * sec / steps);
        std::fflush(stdout);
      }
    }
    if (do_train) {
      model.set_requires_grad(true);
      AdamW optimizer(model.named_tensors());
      MicroBatch mb;
      std::mt19937 rng(7);
      std::normal_distribution<float> nd;
      for (int s = 0; s < train_seqs; ++s) {
        const std::vector<int32_t> t = random_tokens(train_len, c.vocab_size, 200 + s);
        mb.tokens.insert(mb.tokens.end(), t.begin(), t.end());
        mb.lengths.push_back(train_len);
        for (int i = 0; i < train_len; ++i) {
          mb.mask.push_back(i >= train_len / 4 ? 1.0f : 0.0f);
          mb.advantages.push_back(nd(rng));
          // About a random model's log-prob, so the ratios sit near 1 (unclipped, a real gradient).
          mb.old_logprobs.push_back(-static_cast<float>(std::log(static_cast<double>(c.vocab_size))) + 0.05f * nd(rng));
        }
      }
      OptimConfig oc;
      oc.lr = 1e-6;
      K::PolicyLossConfig cfg;
      train_step(model, optimizer, {mb}, cfg, LossMode::Policy, oc, nullptr, threads);  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      TrainMetrics m;
      std::string per_step;  // seconds of each step: the spread is part of the result on a shared machine
      for (int s = 0; s < train_steps; ++s) {
        const auto ts = std::chrono::steady_clock::now();
        m = train_step(model, optimizer, {mb}, cfg, LossMode::Policy, oc, nullptr, threads);
        per_step += (s ? "," : "") + std::to_string(seconds_since(ts)).substr(0, 5);
      }
      const double sec = seconds_since(t0);
      const double tokens = static_cast<double>(train_seqs) * train_len * train_steps;
      std::printf("%s,\"what\":\"train\",\"sequences\":%d,\"length\":%d,\"steps\":%d,\"tokens_per_s\":%.2f,\"s_per_step\":%.3f,"
                  "\"loss\":%.6g,\"grad_norm\":%.6g,\"step_s\":[%s]}\n",
                  head.c_str(), train_seqs, train_len, train_steps, tokens / sec, sec / train_steps, m.loss, m.grad_norm,
                  per_step.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
