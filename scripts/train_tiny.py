#!/usr/bin/env python3
"""Train fireline's embedded default model: a tiny Gemma 4-architecture decoder (MoE block beside
the dense MLP, sliding and full attention layers with k_eq_v and proportional RoPE, final softcap)
with its own byte-level BPE tokenizer, on public-domain English (scripts/make_tiny_corpus: the King
James Bible and the fortune files, both Debian packages).

Runs on the GPU machine (torch 2.11, transformers 5.17, tokenizers). A few minutes of training;
the result is a Hugging Face directory that `fireline quantize` turns into the committed .fire.

Half the training samples are plain text; the other half are chat turns in the model's own chat
template (models/tiny/chat_template.jinja): "Tell me a story about Moses." -> a passage, some with
a short thought in the <|channel>thought ... <channel|> form, so that `fireline run` and thinking
mode have something real to show.

Usage: python3 scripts/train_tiny.py CORPUS_DIR OUT_DIR [--seconds 300]
Writes OUT_DIR/hf/ (config.json, model.safetensors (bf16), tokenizer.json, chat_template.jinja,
generation_config.json, tokenizer_config.json), OUT_DIR/loss.csv, OUT_DIR/train_log.txt and
OUT_DIR/golden.safetensors (transformers' fp32 logits on a chat prompt, for fireline's tests).
"""
import argparse
import json
import math
import os
import random
import re
import time

import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

VOCAB = 4096
SEQ = 256
BATCH = 64
# Fixed ids for the special tokens (the trainer assigns ids in list order). The Gemma 4 turn and
# channel markers keep their Gemma 4 spelling so fireline's chat and reasoning code is exercised.
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|channel>", "<channel|>",
            "<|think|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
            '<|"|>', "<|tool>", "<tool|>"]
PAD, EOS, BOS = 0, 1, 2
TURN_END = SPECIALS.index("<turn|>")
TOOL_RESPONSE = SPECIALS.index("<|tool_response>")

MODEL_CONFIG = dict(
    vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, global_head_dim=128,
    num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=128,
    layer_types=["sliding_attention", "sliding_attention", "full_attention",
                 "sliding_attention", "sliding_attention", "full_attention"],
    enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=256,
    hidden_size_per_layer_input=0, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
    max_position_embeddings=4096, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=[EOS, TURN_END],
    tie_word_embeddings=True)

ASKS_STORY = ["Tell me a story.", "Tell me a story about {topic}.", "Tell me about {topic}.",
              "Write a short passage about {topic}.", "What happened to {topic}?", "Continue the story."]
ASKS_FORTUNE = ["Say something wise.", "Tell me a joke.", "Give me a fortune.", "Tell me something funny.",
                "What do you think about {topic}?", "Share a quote."]
STOPWORDS = {"And", "The", "But", "For", "Then", "Now", "Thus", "When", "If", "So", "I", "A", "In",
             "He", "She", "They", "It", "Ye", "Thou", "O", "Lord", "God", "This", "That", "There"}


def log(f, msg):
    print(msg, flush=True)
    f.write(msg + "\n")
    f.flush()


def load_corpus(corpus_dir):
    with open(os.path.join(corpus_dir, "kjv.txt"), encoding="utf-8") as f:
        chapters = [line.strip() for line in f if line.strip()]
    with open(os.path.join(corpus_dir, "fortunes.txt"), encoding="utf-8", errors="replace") as f:
        fortunes = [line.rstrip("\n").replace("\\n", "\n").strip() for line in f]
    fortunes = [x for x in fortunes if 20 < len(x) < 600]
    return chapters, fortunes


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def sentences(chapter):
    return [s.strip() for s in re.split(r"(?<=[.;:?!])\s+", chapter) if s.strip()]


def topic_of(text, rng):
    names = [w for w in re.findall(r"\b[A-Z][a-z]{2,}\b", text) if w not in STOPWORDS]
    return rng.choice(names) if names else None


def chat_sample(ask, answer, thought=None):
    s = "<bos>"
    if thought is not None:
        s += "<|turn>system\n<|think|><turn|>\n"
    s += f"<|turn>user\n{ask}<turn|>\n<|turn>model\n"
    s += f"<|channel>thought\n{thought}<channel|>" if thought is not None else "<|channel>thought\n<channel|>"
    return s + f"{answer}<turn|>\n"


def build_samples(chapters, fortunes, rng):
    samples = []
    for ch in chapters:                                  # plain text: whole chapters
        samples.append("<bos>" + ch + "<eos>")
    for fo in fortunes:
        samples.append("<bos>" + fo + "<eos>")
    n_plain = len(samples)
    for _ in range(n_plain):                             # as many chat samples
        thinking = rng.random() < 0.15
        if rng.random() < 0.6:
            sents = sentences(rng.choice(chapters))
            i = rng.randrange(len(sents))
            answer = " ".join(sents[i:i + rng.randint(2, 6)])
            ask = rng.choice(ASKS_STORY)
        else:
            answer = rng.choice(fortunes)
            ask = rng.choice(ASKS_FORTUNE)
        topic = topic_of(answer, rng)
        if "{topic}" in ask:
            if topic is None:
                ask = "Tell me a story."
            else:
                ask = ask.format(topic=topic)
        thought = None
        if thinking:
            thought = f"The user asks: {ask} I will answer with a short passage" + \
                      (f" about {topic}." if topic else ".")
        samples.append(chat_sample(ask, answer, thought))
    return samples


def pack(tok, samples, rng):
    rng.shuffle(samples)
    ids = []
    for enc in tok.encode_batch(samples, add_special_tokens=False):
        ids.extend(enc.ids)
    n = len(ids) // SEQ
    return torch.tensor(ids[:n * SEQ], dtype=torch.long).view(n, SEQ)


def make_model(device):
    cfg = Gemma4TextConfig(**MODEL_CONFIG)
    for impl in ("grouped_mm", "eager"):
        try:
            model = Gemma4ForCausalLM._from_config(cfg, attn_implementation="sdpa", experts_implementation=impl)
            model = model.to(device)
            probe = torch.randint(0, VOCAB, (2, 16), device=device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(input_ids=probe, labels=probe).loss.backward()  # forward and backward both work
            model.zero_grad(set_to_none=True)
            return cfg, model, impl
        except Exception as e:  # noqa: BLE001 - fall back to the eager expert loop
            print(f"experts_implementation={impl} failed: {e}")
    raise SystemExit("no experts implementation works")


@torch.no_grad()
def generate(model, tok, prompt, n, temperature, gen):
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids], device="cuda")
    out = []
    for _ in range(n):
        logits = model(input_ids=ids).logits[0, -1].float()
        if temperature == 0:
            nxt = int(logits.argmax())
        else:
            nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
        if nxt in (EOS, TURN_END):
            break
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]], device="cuda")], 1)
    return tok.decode(out, skip_special_tokens=False)


def write_golden(hf_dir, path):
    """Logits of the saved checkpoint (reloaded from hf_dir, fp32 on the CPU, eager attention) on
    a chat prompt: the golden that fireline's CPU oracle must match on the real trained weights."""
    tok = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    model = Gemma4ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    prompt = ("<bos><|turn>user\nTell me a story about Moses.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
              "And Moses went up")
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    save_file({"input_ids": ids[0].to(torch.int32).contiguous(), "logits_last8": logits[-8:].contiguous()}, path,
              metadata={"transformers": transformers.__version__, "torch": torch.__version__,
                        "numerics": "fp32 eager attention on CPU, weights as saved (bf16)"})
    print(f"golden: {ids.shape[1]} tokens, top token {int(logits[-1].argmax())}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden-only", metavar="HF_DIR", help="only rewrite OUT/golden.safetensors from HF_DIR")
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    if args.golden_only:
        os.makedirs(args.out, exist_ok=True)
        write_golden(args.golden_only, os.path.join(args.out, "golden.safetensors"))
        return
    os.makedirs(os.path.join(args.out, "hf"), exist_ok=True)
    flog = open(os.path.join(args.out, "train_log.txt"), "w")
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    log(flog, f"transformers {transformers.__version__}, torch {torch.__version__}, "
              f"device {torch.cuda.get_device_name(0)}")

    chapters, fortunes = load_corpus(args.corpus)
    t0 = time.time()
    tok = train_tokenizer(chapters + fortunes)
    log(flog, f"tokenizer: {tok.get_vocab_size()} tokens from {len(chapters)} chapters and "
              f"{len(fortunes)} fortunes in {time.time() - t0:.1f} s")
    samples = build_samples(chapters, fortunes, rng)
    data = pack(tok, samples, rng)
    n_val = max(8, data.shape[0] // 100)
    val, train = data[:n_val].cuda(), data[n_val:].cuda()
    log(flog, f"data: {train.numel()} training tokens in {train.shape[0]} rows of {SEQ}, {val.numel()} held out")

    cfg, model, impl = make_model("cuda")
    n_params = sum(p.numel() for p in model.parameters())
    log(flog, f"model: {n_params / 1e6:.2f} M parameters, experts_implementation={impl}")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warmup, peak_lr, min_lr = 100, 3e-3, 1e-4
    total_steps = None
    losses = []
    start = time.time()
    step = 0
    model.train()
    while True:
        elapsed = time.time() - start
        if step == 10:
            t10 = elapsed
        if step == 40:  # fix the schedule length from the step time after warm-up
            per_step = (elapsed - t10) / 30
            total_steps = max(200, int(40 + (args.seconds - elapsed) / per_step))
            log(flog, f"{per_step * 1000:.1f} ms/step -> {total_steps} steps")
        if total_steps is not None and step >= total_steps:
            break
        horizon = total_steps or 10_000
        if step < warmup:
            lr = peak_lr * (step + 1) / warmup
        else:
            lr = min_lr + 0.5 * (peak_lr - min_lr) * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, horizon - warmup))))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = train[torch.randint(0, train.shape[0], (BATCH,), device="cuda")]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 25 == 0 or step == 1:
            val_loss = None
            if step % 100 == 0:
                model.eval()
                with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                    val_loss = sum(model(input_ids=val[i:i + BATCH], labels=val[i:i + BATCH]).loss.item()
                                   for i in range(0, val.shape[0], BATCH)) / math.ceil(val.shape[0] / BATCH)
                model.train()
            losses.append((step, time.time() - start, loss.item(), val_loss))
            log(flog, f"step {step:5d}  {time.time() - start:6.1f} s  lr {lr:.2e}  loss {loss.item():.3f}"
                      + (f"  val {val_loss:.3f}" if val_loss is not None else ""))

    model.eval()
    with open(os.path.join(args.out, "loss.csv"), "w") as f:
        f.write("step,seconds,train_loss,val_loss\n")
        for s, t, l, v in losses:
            f.write(f"{s},{t:.1f},{l:.4f},{'' if v is None else f'{v:.4f}'}\n")

    gen = torch.Generator(device="cuda").manual_seed(1)
    prompts = ["<bos><|turn>user\nTell me a story about Moses.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
               "<bos><|turn>user\nSay something wise.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
               "<bos>And it came to pass",
               "<bos><|turn>system\n<|think|><turn|>\n<|turn>user\nTell me a story.<turn|>\n<|turn>model\n"]
    for p in prompts:
        log(flog, f"--- {p!r}\n  greedy: {generate(model, tok, p, 60, 0, gen)!r}\n"
                  f"  T=0.8:  {generate(model, tok, p, 60, 0.8, gen)!r}")

    hf = os.path.join(args.out, "hf")
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()
             if not k.startswith("lm_head.")}
    save_file(state, os.path.join(hf, "model.safetensors"), metadata={"format": "pt"})
    config = json.loads(cfg.to_json_string(use_diff=False))
    config.pop("transformers_version", None)
    config["architectures"] = ["Gemma4ForCausalLM"]
    config["dtype"] = "bfloat16"
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    tok.save(os.path.join(hf, "tokenizer.json"))
    with open(os.path.join(hf, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": [EOS, TURN_END, TOOL_RESPONSE], "pad_token_id": PAD,
                   "do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95}, f, indent=2)
        f.write("\n")
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": False}, f, indent=2)
        f.write("\n")
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "models", "tiny", "chat_template.jinja")) as src, \
            open(os.path.join(hf, "chat_template.jinja"), "w") as dst:
        dst.write(src.read())
    write_golden(hf, os.path.join(args.out, "golden.safetensors"))
    log(flog, f"wrote {hf} in {time.time() - start:.0f} s of training")


if __name__ == "__main__":
    main()
