#!/usr/bin/env python3
"""Make the Qwen3.5 golden fixtures: tiny random Qwen3.5 checkpoints (Gated DeltaNet hybrid, dense
and MoE) and the logits transformers computes for them, so that fireline's CPU oracle can be
checked against the reference implementation. Companion of scripts/gen_fixtures.py (Gemma 4).

Runs on the GPU machine (torch + transformers 5.17); computes on the CPU in fp32 with eager
attention and the torch fallbacks of the delta-rule kernels (chunked for prompts, recurrent for
single cached tokens), which is the reference numerics (DESIGN §7). Writes, per fixture, OUT/<name>/:
  config.json          the model config (text-only or the released multimodal-wrapper form)
  model.safetensors    every weight random (A_log, dt_bias, conv, norm gains too)
  golden.safetensors   input_ids [T] i32; logits_prefill [T, V] (one full forward, no cache);
                       logits_decode [T, V] (token by token through transformers' cache);
                       generated_ids [G] i32 and logits_generated [G, V] (greedy continuation;
                       row i holds the logits that chose generated_ids[i]);
                       when transformers' own two-call prefill agrees with its one-call prefill:
                       two_chunk_split [1] i32 and logits_two_chunk [T, V] (first call feeds
                       input_ids[:split], the second the rest through the cache)
The prompt (150 tokens) is longer than two 64-token delta-rule chunks and ends mid-chunk.
Usage: python3 scripts/gen_fixtures_qwen35.py OUT_DIR [FIXTURE ...]
Exit status 1 when any fixture failed; each failure is printed with its traceback.
"""
import json
import os
import sys
import traceback

import torch
import transformers
from safetensors.torch import save_file

PROMPT_TOKENS = 150
TWO_CHUNK_SPLIT = 100  # not a multiple of 64: the second call starts mid-chunk
GENERATE_TOKENS = 8
VOCAB = 512
AGREE = 1e-4  # transformers' two-call prefill must match its one-call prefill this closely


def layer_types(n, interval=4):
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]


# Rotated span = head_dim * 0.25; mrope_section sums to half of it (text positions make the
# sections irrelevant numerically, but the config must be consistent for transformers).
FIXTURES = {
    # 0.8B/4B-style dense: tied embeddings, 8 layers (full attention at 3 and 7), grouped value
    # heads (nV = 2 nK), head_dim 32 (rotated span 8), f32 weights, text-only naming.
    "qwen35-dense": dict(
        kind="dense",
        config=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=8, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                                         mrope_section=[2, 1, 1], mrope_interleaved=True)),
        layers=8, layout="text", dtype=torch.float32, keep_f32=(), seed=11,
        # Conditioning (see randomize): logits O(1) with the tied head, small q/k/v pre-conv
        # rows, gentler decays. The first version of this fixture (unit embeddings, qkv scale 1,
        # A up to 3) had logits of std 8 and transformers' own prefill and cached decode 4.8e-4
        # apart, too close to the 1e-4 budget to tell a bug from rounding.
        embed_std=64 ** -0.5, qkv_scale=0.05, decay_range=(0.01, 0.6)),
    # 35B-A3B-style MoE: untied lm_head, 4 experts top-2 (expert width 48), shared expert (width
    # 80) with its sigmoid gate, head_dim 64 (rotated span 16), nV = 4 nK with dk != dv. Saved the
    # way the released checkpoints are: wrapper names (model.language_model.*), text_config nested
    # under model_type qwen3_5_moe, fused 3-D expert tensors, bf16 weights with A_log/dt_bias kept
    # in f32, plus mtp.* and model.visual.* tensors that a text forward must ignore.
    "qwen35-moe": dict(
        kind="moe",
        config=dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
                    head_dim=64, linear_num_key_heads=1, linear_num_value_heads=4, linear_key_head_dim=32,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=48, shared_expert_intermediate_size=80, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                                         mrope_section=[3, 3, 2], mrope_interleaved=True)),
        layers=4, layout="wrapper", dtype=torch.bfloat16, keep_f32=("A_log", "dt_bias"), seed=12,
        # The same weights again, text-only naming (model.*, model_type qwen3_5_moe_text) with
        # per-expert tensors (experts.{e}.{gate,up,down}_proj.weight): the other released layout.
        # No golden.safetensors of its own: the tests use this fixture's.
        split_copy="qwen35-moe-split"),
}


def import_classes(kind):
    """The text-only causal LM and its config; falls back to the model module when the top-level
    package does not export them."""
    names = ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", "qwen3_5") if kind == "dense" else \
            ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", "qwen3_5_moe")
    model = getattr(transformers, names[0], None)
    config = getattr(transformers, names[1], None)
    if model is None or config is None:
        import importlib
        modeling = importlib.import_module(f"transformers.models.{names[2]}.modeling_{names[2]}")
        configuration = importlib.import_module(f"transformers.models.{names[2]}.configuration_{names[2]}")
        model, config = getattr(modeling, names[0]), getattr(configuration, names[1])
    return model, config


OFFSET_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")


def randomize(model, dtype, keep_f32, gen, embed_std=1.0, qkv_scale=1.0, decay_range=(0.02, 3.0)):
    """Every parameter random; values rounded to their storage dtype so the fp32 reference run sees
    exactly what the file holds.

    Conditioning knobs. The gated output norm divides each value head's delta-rule output o by
    rms(o); o is a sum of (q . k) terms that random weights sometimes cancel to ~1e-3, where f32
    rounding of the different summation orders of the chunked and recurrent forms (and of
    transformers and fireline) is amplified ~1000x into the residual stream. Small pre-conv q/k/v
    rows (qkv_scale) put such heads under the norm's eps (1e-6), which damps them; gentle decays
    keep several tokens in every head's state; embed_std sets the tied head's logit scale."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(OFFSET_NORMS) or name == "model.norm.weight":
                v = torch.randn(p.shape, generator=gen) * 0.3          # (1 + w) gains around 1
            elif name.endswith("linear_attn.norm.weight"):
                v = torch.rand(p.shape, generator=gen) + 0.5           # plain gain around 1
            elif name.endswith("A_log"):
                # A = exp(A_log): per-token decays exp(-A softplus(.)) from ~1 (long memory, chunk
                # boundaries matter) down to ~0.1 with the default range
                v = torch.empty(p.shape).uniform_(*decay_range, generator=gen).log()
            elif name.endswith("dt_bias"):
                v = torch.randn(p.shape, generator=gen) * 0.5
            elif name.endswith("conv1d.weight"):
                v = torch.randn(p.shape, generator=gen) * 0.5
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=gen) * embed_std
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                v = torch.randn(p.shape, generator=gen) / fan_in ** 0.5  # activations stay O(1)
                if name.endswith("in_proj_qkv.weight"):
                    v = v * qkv_scale
            else:
                v = torch.randn(p.shape, generator=gen)
            store = torch.float32 if any(k in name for k in keep_f32) else dtype
            p.copy_(v.to(store).to(torch.float32))


def storage_dtype(name, dtype, keep_f32):
    return torch.float32 if any(k in name for k in keep_f32) else dtype


@torch.no_grad()
def run_reference(model, ids):
    T = ids.shape[1]
    prefill = model(input_ids=ids, use_cache=False).logits[0].float()

    # Token by token: the first call creates the model's own hybrid cache (attention KV + conv and
    # recurrent states), the following ones take the single-token recurrent path.
    decode, cache = [], None
    for t in range(T):
        out = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        decode.append(out.logits[0, -1].float())
    decode = torch.stack(decode)

    generated, gen_logits = [], []
    next_id = int(decode[-1].argmax())
    for _ in range(GENERATE_TOKENS):
        generated.append(next_id)
        out = model(input_ids=torch.tensor([[next_id]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        gen_logits.append(out.logits[0, -1].float())
        next_id = int(gen_logits[-1].argmax())
    chose = torch.stack([decode[-1]] + gen_logits[:-1])

    # Two calls: does this transformers version carry the conv window and delta state into a
    # multi-token continuation? Kept only when it agrees with the one-call prefill.
    two_chunk = None
    try:
        first = model(input_ids=ids[:, :TWO_CHUNK_SPLIT], use_cache=True)
        second = model(input_ids=ids[:, TWO_CHUNK_SPLIT:], past_key_values=first.past_key_values, use_cache=True)
        two_chunk = torch.cat([first.logits[0], second.logits[0]]).float()
    except Exception:
        print("  two-call prefill raised (not saved):")
        traceback.print_exc()
    return prefill, decode, torch.tensor(generated, dtype=torch.int32), chose, two_chunk


def describe(cfg):
    keys = ["model_type", "hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads",
            "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
            "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "intermediate_size",
            "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
            "tie_word_embeddings", "rope_parameters", "rms_norm_eps", "vocab_size"]
    return {k: getattr(cfg, k) for k in keys if hasattr(cfg, k)}


def write_checkpoint(d, state, config):
    os.makedirs(d, exist_ok=True)
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def make_fixture(name, spec, out_dir):
    Model, Config = import_classes(spec["kind"])
    gen = torch.Generator().manual_seed(spec["seed"])
    cfg = Config(vocab_size=VOCAB, rms_norm_eps=1e-6, max_position_embeddings=1024, hidden_act="silu",
                 attention_bias=False, layer_types=layer_types(spec["layers"]), **spec["config"])
    print(f"{name}: {Model.__name__} / {Config.__name__}")
    print(json.dumps(describe(cfg), indent=None, default=str))
    try:
        model = Model._from_config(cfg, attn_implementation="eager", experts_implementation="eager")
    except (TypeError, ValueError):
        model = Model._from_config(cfg, attn_implementation="eager")
    model = model.to(torch.float32).eval()
    knobs = {k: spec[k] for k in ("embed_std", "qkv_scale", "decay_range") if k in spec}
    randomize(model, spec["dtype"], spec["keep_f32"], gen, **knobs)
    if cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        print("  NOTE: lm_head was not tied to embed_tokens after _from_config; tying it by hand")
        model.lm_head.weight = model.model.embed_tokens.weight

    ids = torch.randint(3, VOCAB, (1, PROMPT_TOKENS), generator=gen)
    prefill, decode, generated, chose, two_chunk = run_reference(model, ids)
    step = (prefill - decode).abs().max().item()
    print(f"  max |prefill - decode| in transformers = {step:.3g}, logit std {prefill.std().item():.3g}, "
          f"generated {generated.tolist()}")
    if step > AGREE:
        print(f"  WARNING: transformers' cached decode differs from its prefill by {step:.3g} (> {AGREE})")
    golden = {"input_ids": ids[0].to(torch.int32).contiguous(), "logits_prefill": prefill.contiguous(),
              "logits_decode": decode.contiguous(), "generated_ids": generated.contiguous(),
              "logits_generated": chose.contiguous()}
    if two_chunk is not None:
        d2 = (two_chunk - prefill).abs().max().item()
        if d2 <= AGREE:
            print(f"  two-call prefill (split {TWO_CHUNK_SPLIT}) agrees with one-call: {d2:.3g}; saved")
            golden["two_chunk_split"] = torch.tensor([TWO_CHUNK_SPLIT], dtype=torch.int32)
            golden["logits_two_chunk"] = two_chunk.contiguous()
        else:
            print(f"  two-call prefill (split {TWO_CHUNK_SPLIT}) differs from one-call by {d2:.3g}: "
                  f"this transformers does not continue a multi-token prefill from its cache; not saved")

    dtype_name = "bfloat16" if spec["dtype"] == torch.bfloat16 else "float32"
    state = {k: v.detach().to(storage_dtype(k, spec["dtype"], spec["keep_f32"])).contiguous()
             for k, v in model.state_dict().items()
             if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    config = json.loads(cfg.to_json_string(use_diff=False))
    config.pop("transformers_version", None)
    config["dtype"] = dtype_name
    config["full_attention_interval"] = 4

    text_config = dict(config)
    if spec["layout"] == "wrapper":
        wrapper_type = config["model_type"].removesuffix("_text")
        arch = "Qwen3_5MoeForConditionalGeneration" if spec["kind"] == "moe" else "Qwen3_5ForConditionalGeneration"
        wrapped = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
                   for k, v in state.items()}
        H = cfg.hidden_size
        # what the released files carry beside the text decoder; a text forward ignores both
        wrapped["mtp.fc.weight"] = torch.randn(H, 2 * H, generator=gen).to(spec["dtype"])
        wrapped["mtp.norm.weight"] = torch.randn(H, generator=gen).to(spec["dtype"])
        wrapped["model.visual.patch_embed.proj.weight"] = torch.randn(16, 3, 2, 4, 4, generator=gen).to(spec["dtype"])
        text = dict(config)
        text.pop("architectures", None)
        wrapper = {"model_type": wrapper_type, "architectures": [arch], "dtype": dtype_name,
                   "text_config": text, "tie_word_embeddings": cfg.tie_word_embeddings,
                   "vision_config": {"model_type": wrapper_type + "_vision"},
                   "image_token_id": 248056, "video_token_id": 248057,
                   "vision_start_token_id": 248053, "vision_end_token_id": 248054}
        write_checkpoint(os.path.join(out_dir, name), wrapped, wrapper)
    else:
        config["architectures"] = [Model.__name__]
        write_checkpoint(os.path.join(out_dir, name), state, config)

    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "numerics": "fp32 eager attention, torch delta-rule fallbacks, on CPU"}
    save_file(golden, os.path.join(out_dir, name, "golden.safetensors"), metadata=meta)

    if spec.get("split_copy"):
        split = {}
        for k, v in state.items():
            if k.endswith("mlp.experts.gate_up_proj"):
                base = k[: -len("gate_up_proj")]
                inter = v.shape[1] // 2
                for e in range(v.shape[0]):
                    split[f"{base}{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                    split[f"{base}{e}.up_proj.weight"] = v[e, inter:].contiguous()
            elif k.endswith("mlp.experts.down_proj"):
                base = k[: -len("down_proj")]
                for e in range(v.shape[0]):
                    split[f"{base}{e}.down_proj.weight"] = v[e].contiguous()
            else:
                split[k] = v
        text_config["architectures"] = [Model.__name__]
        d = os.path.join(out_dir, spec["split_copy"])
        write_checkpoint(d, split, text_config)  # its goldens are the fused fixture's (same weights)
        print(f"  {spec['split_copy']}: same weights, per-expert tensors, text-only naming (goldens in {name})")

    for n in [name] + ([spec["split_copy"]] if spec.get("split_copy") else []):
        d = os.path.join(out_dir, n)
        sizes = {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))}
        print(f"  wrote {d}: {sizes}")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    only = sys.argv[2:]
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    failed = []
    for name, spec in FIXTURES.items():
        if only and name not in only:
            continue
        try:
            make_fixture(name, spec, out_dir)
        except Exception:
            print(f"FAILED {name}:")
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"failed fixtures: {', '.join(failed)}")
        sys.exit(1)
    print("all fixtures written")


if __name__ == "__main__":
    main()
