#!/usr/bin/env python3
"""Make the golden fixtures: tiny random Gemma 4 checkpoints and the logits transformers computes
for them, so that fireline's CPU oracle can be checked against the reference implementation.

Runs on the GPU machine (torch 2.11 + transformers 5.17); computes on the CPU in fp32 with eager
attention, which is the reference numerics (DESIGN §7). Writes, per fixture, into OUT/<name>/:
  config.json          the model config (text-only or multimodal-wrapper form, see FIXTURES)
  model.safetensors    every weight random (norm gains, layer scalars and router scales too)
  golden.safetensors   input_ids [T] i32; logits_prefill [T, V] (one full forward, no cache);
                       logits_decode [T, V] (token by token through transformers' KV cache);
                       generated_ids [G] i32 and logits_generated [G, V] (greedy continuation)
Usage: python3 scripts/gen_fixtures.py OUT_DIR
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig
from transformers.cache_utils import DynamicCache

PROMPT_TOKENS = 48
GENERATE_TOKENS = 8
VOCAB = 512

# Each fixture mirrors one published Gemma 4 variant at toy size. Windows of 8-12 with a
# 48-token prompt make the sliding ring roll over several times.
FIXTURES = {
    # 26B-A4B-style: MoE block beside the dense MLP (4 experts, top-2, expert width 176, which is
    # not a multiple of 128), attention_k_eq_v on full layers, proportional RoPE, softcap. Saved
    # the way the released checkpoints are: multimodal wrapper names (model.language_model.*),
    # text_config nested under model_type "gemma4", global_head_dim spelling, bf16 weights.
    "gemma4-moe": dict(
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                    attention_k_eq_v=True, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                    enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=176,
                    hidden_size_per_layer_input=0),
        layout="wrapper", dtype=torch.bfloat16, seed=1),
    # 31B-style dense: k_eq_v full layers, wider MLP, window 12; transformers 5.17 text-only
    # naming and per_layer_config spelling; f32 weights.
    "gemma4-dense": dict(
        config=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                    attention_k_eq_v=True, sliding_window=12,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                 "sliding_attention", "sliding_attention", "full_attention"],
                    hidden_size_per_layer_input=0),
        layout="text", dtype=torch.float32, seed=2),
    # E2B-style: per-layer embeddings, the last 3 layers share KV with earlier ones, the
    # double-wide MLP on those layers, one KV head, no k_eq_v; the checkpoint also carries the
    # (ignored) K/V projections of the shared layers, as the released files do.
    "gemma4-e2b": dict(
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=8, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=16, global_head_dim=32, attention_k_eq_v=False,
                    sliding_window=8,
                    layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
                                 "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                    num_kv_shared_layers=3, use_double_wide_mlp=True,
                    hidden_size_per_layer_input=16, vocab_size_per_layer_input=VOCAB),
        layout="text", dtype=torch.bfloat16, seed=3),
}


def randomize(model, dtype, gen):
    """Every parameter and persistent buffer random; values rounded to the storage dtype so the
    fp32 reference run sees exactly what the file holds."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("inv_freq") or "embed_scale" in name:
                continue
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith("layer_scalar") \
                    or name.endswith("router.scale") or name.endswith("per_expert_scale"):
                v = torch.rand(p.shape, generator=gen) + 0.5          # gains around 1
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                v = torch.randn(p.shape, generator=gen) / fan_in ** 0.5  # activations stay O(1)
                if "embed_tokens" in name:
                    v = torch.randn(p.shape, generator=gen)
            else:
                v = torch.randn(p.shape, generator=gen)
            p.copy_(v.to(dtype).to(torch.float32))


@torch.no_grad()
def run_reference(model, ids):
    T = ids.shape[1]
    prefill = model(input_ids=ids, use_cache=False).logits[0].float()
    cache = DynamicCache(config=model.config)
    decode = []
    for t in range(T):
        out = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        decode.append(out.logits[0, -1].float())
    decode = torch.stack(decode)
    generated, gen_logits = [], []
    next_id = int(decode[-1].argmax())
    for _ in range(GENERATE_TOKENS):
        generated.append(next_id)
        out = model(input_ids=torch.tensor([[next_id]]), past_key_values=cache, use_cache=True)
        gen_logits.append(out.logits[0, -1].float())
        next_id = int(gen_logits[-1].argmax())
    # gen_logits[i] are the logits after feeding generated[i]; the logits that chose
    # generated[i] are decode[-1] for i = 0 and gen_logits[i - 1] after that.
    chose = torch.stack([decode[-1]] + gen_logits[:-1])
    return prefill, decode, torch.tensor(generated, dtype=torch.int32), chose


def make_fixture(name, spec, out_dir):
    gen = torch.Generator().manual_seed(spec["seed"])
    cfg = Gemma4TextConfig(vocab_size=VOCAB, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
                           max_position_embeddings=1024, **spec["config"])
    try:
        model = Gemma4ForCausalLM._from_config(cfg, attn_implementation="eager", experts_implementation="eager")
    except (TypeError, ValueError):
        model = Gemma4ForCausalLM._from_config(cfg, attn_implementation="eager")
    model = model.to(torch.float32).eval()
    randomize(model, spec["dtype"], gen)
    ids = torch.randint(3, VOCAB, (1, PROMPT_TOKENS), generator=gen)
    prefill, decode, generated, gen_logits = run_reference(model, ids)
    print(f"{name}: max |prefill - decode| in transformers = {(prefill - decode).abs().max().item():.3g}, "
          f"logit std {prefill.std().item():.3g}, generated {generated.tolist()}")

    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    state = {k: v.detach().to(spec["dtype"]).contiguous() for k, v in model.state_dict().items()
             if not k.startswith("lm_head.")}  # tied to embed_tokens
    config = json.loads(cfg.to_json_string(use_diff=False))
    config["dtype"] = "bfloat16" if spec["dtype"] == torch.bfloat16 else "float32"
    config.pop("transformers_version", None)
    config["architectures"] = ["Gemma4ForCausalLM"]
    if name == "gemma4-e2b":
        # the released E-models still store K/V projections for KV-shared layers; loaders ignore them
        first_shared = cfg.num_hidden_layers - cfg.num_kv_shared_layers
        for layer in range(first_shared, cfg.num_hidden_layers):
            hd = cfg.per_layer_config[layer].head_dim
            for proj in ("k_proj", "v_proj"):
                state[f"model.layers.{layer}.self_attn.{proj}.weight"] = torch.randn(
                    cfg.num_key_value_heads * hd, cfg.hidden_size, generator=gen).to(spec["dtype"])
    if spec["layout"] == "wrapper":
        state = {k.replace("model.", "model.language_model.", 1): v for k, v in state.items()}
        text = dict(config)
        text.pop("per_layer_config", None)
        text["global_head_dim"] = spec["config"]["global_head_dim"]
        text["num_global_key_value_heads"] = spec["config"].get("num_global_key_value_heads")
        text.pop("architectures", None)
        config = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
                  "dtype": text["dtype"], "text_config": text,
                  "vision_config": {"model_type": "gemma4_vision"}, "tie_word_embeddings": True}
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    golden = {"input_ids": ids[0].to(torch.int32).contiguous(), "logits_prefill": prefill.contiguous(),
              "logits_decode": decode.contiguous(), "generated_ids": generated.contiguous(),
              "logits_generated": gen_logits.contiguous()}
    save_file(golden, os.path.join(d, "golden.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__,
                        "numerics": "fp32 eager attention on CPU"})


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for name, spec in FIXTURES.items():
        make_fixture(name, spec, out_dir)


if __name__ == "__main__":
    main()
