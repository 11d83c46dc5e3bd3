# One-off probe: copy the transformers model sources we implement against, and show how
# transformers 5.17 saves a Gemma 4 text config.
import os, shutil, json, sys, tarfile
import transformers
out = os.environ["OUT"]
base = os.path.dirname(transformers.__file__)
with tarfile.open(os.path.join(out, "hf_src.tar.gz"), "w:gz") as tar:
    for sub in ["models/gemma4", "models/qwen3_5", "models/qwen3_5_moe"]:
        tar.add(os.path.join(base, sub), arcname=sub)
    for f in ["modeling_rope_utils.py", "masking_utils.py", "conversion_mapping.py", "cache_utils.py", "configuration_utils.py"]:
        p = os.path.join(base, f)
        if os.path.exists(p): tar.add(p, arcname=f)
print("transformers", transformers.__version__)
from transformers import Gemma4TextConfig
cfg = Gemma4TextConfig(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
    intermediate_size=96, sliding_window=8, layer_types=["sliding_attention"]*3+["full_attention"],
    attention_k_eq_v=True, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=40)
d = os.path.join(out, "cfg"); os.makedirs(d, exist_ok=True)
cfg.save_pretrained(d)
print(open(os.path.join(d, "config.json")).read())
