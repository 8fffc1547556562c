#!/usr/bin/env python3
"""Writes fuzz/seeds/tiny-llama.gguf: a random-weight Llama GGUF of a few kilobytes (vocabulary
16, width 32, one layer) that strata loads and runs, the seed the gguf_load fuzz target mutates.
Needs the `gguf` package (pip install gguf)."""
import os
import numpy as np
from gguf import GGUFWriter

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "tiny-llama.gguf")
os.makedirs(os.path.dirname(out), exist_ok=True)
w = GGUFWriter(out, "llama")
E, FF, V = 32, 64, 16
w.add_block_count(1)
w.add_context_length(64)
w.add_embedding_length(E)
w.add_feed_forward_length(FF)
w.add_head_count(2)
w.add_head_count_kv(1)
w.add_layer_norm_rms_eps(1e-5)
w.add_rope_freq_base(10000.0)
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("smollm")
w.add_token_list([bytes([ord("a") + i]) for i in range(V - 2)] + [b"<s>", b"</s>"])
w.add_token_types([1] * (V - 2) + [3, 3])
w.add_token_merges(["a b"])
w.add_bos_token_id(V - 2)
w.add_eos_token_id(V - 1)
rng = np.random.default_rng(0)


def tensor(name, shape):
    w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))


tensor("token_embd.weight", (V, E))
tensor("output_norm.weight", (E,))
for name, shape in [("attn_norm", (E,)), ("ffn_norm", (E,)), ("attn_q", (E, E)), ("attn_k", (16, E)),
                    ("attn_v", (16, E)), ("attn_output", (E, E)), ("ffn_gate", (FF, E)),
                    ("ffn_up", (FF, E)), ("ffn_down", (E, FF))]:
    tensor(f"blk.0.{name}.weight", shape)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(out)
