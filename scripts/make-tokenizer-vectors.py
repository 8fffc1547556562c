#!/usr/bin/env python3
r"""Regenerate fixtures/tokenizer/<model>.json: llama.cpp's own token ids for a model's vocabulary.

strata-tokenizer must tokenize exactly like llama.cpp. This script asks llama.cpp itself (through
llama-cpp-python, which vendors it) for the reference answers, so the Rust golden tests
(crates/tokenizer/tests/it/golden_vectors.rs) compare against the real implementation rather than
against our reading of it. Fixtures in the tree: smollm2.json (SmolLM2-135M-Instruct, byte-level
BPE, the default model) and gemma3.json (Gemma 3 270M, SentencePiece).

Inputs:
  * the test sentences of llama.cpp's tokenizer suite (`models/ggml-vocab-*.gguf.inp` in the
    llama.cpp tree; llama-cpp-python's source distribution carries it under vendor/llama.cpp), and
  * EXTRA_INPUTS below: chat-template strings with special tokens, unicode, digits, whitespace
    runs and code.

Every input is tokenized twice, with special-token parsing off and on, never adding BOS. For each
case the fixture stores the ids and llama.cpp's detokenization of them (`llama_detokenize` with
remove_special=false, unparse_special off and on). It also stores the end-of-generation set,
BOS/EOS, add_bos, and SHA-256 digests of every token's piece so the Rust side can check its
per-token byte table without shipping 49k strings. Finally it renders the GGUF chat template with
Python jinja2 the way Hugging Face does (trim_blocks, lstrip_blocks) for a few conversations.

Setup (llama-cpp-python 0.3.36 builds llama.cpp from source: several minutes on 2 cores):

    python3 -m pip install llama-cpp-python==0.3.36 jinja2
    python3 -m pip download --no-deps --no-binary llama-cpp-python \
        llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp

Usage (M is llama.cpp's models/ directory, models come from the strata store):

    M=/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/models
    python3 scripts/make-tokenizer-vectors.py \
        --model ~/.cache/strata/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
        --inp $M/ggml-vocab-starcoder.gguf.inp --inp $M/ggml-vocab-qwen35.gguf.inp \
        --out fixtures/tokenizer/smollm2.json
    python3 scripts/make-tokenizer-vectors.py \
        --model ~/.cache/strata/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf \
        --inp $M/ggml-vocab-starcoder.gguf.inp --inp $M/ggml-vocab-qwen35.gguf.inp \
        --out fixtures/tokenizer/gemma3.json
"""

import argparse
import ctypes
import hashlib
import json
import os
import sys

SEP = "\n__ggml_vocab_test__\n"

# Strings llama.cpp's suite does not cover but a chat server sees every day.
EXTRA_INPUTS = [
    # ChatML as SmolLM2's template renders it.
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n",
    "<|im_start|>user",
    "<|im_start|><|im_start|><|im_end|>",
    "foo<|im_end|>bar",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start",
    "im_start|>",
    "<|IM_START|>user",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<repo_name>strata<file_sep>src/lib.rs<jupyter_code>print(1)<empty_output>",
    "<reponame><filename><gh_stars><issue_start><issue_comment><issue_closed>",
    "<jupyter_start><jupyter_text><jupyter_output><jupyter_script>",
    # Unicode: accents, combining marks, CJK, emoji with joiners and modifiers, RTL, Hangul, Thai.
    "naïve café — déjà vu, Ångström, façade",
    "e\u0301 a\u0300 combining marks",
    "日本語のテキストと中文文本",
    "👩‍👩‍👧‍👦 family, 👍🏽 thumbs, 🇫🇷 flag",
    "مرحبا بالعالم",
    "안녕하세요 세계",
    "สวัสดีชาวโลก",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "\u00a0non-breaking\u2003em-space\u3000ideographic",
    # Digits and numbers.
    "1234567890",
    "3.14159 2.71828 -42 +7 1e-9 0x1F 1_000_000",
    "Order #12345 costs $1,299.99 (15% off) on 2024-11-21 at 09:30.",
    "٣٤٥ ४५६ ⅷ ½ ²",
    # Whitespace runs.
    "a  b   c    d",
    "\t\tindented\n\n\n\nlines\r\n\r\nwindows",
    "trailing spaces   ",
    "   leading spaces",
    " \n \n ",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    " " * 40,
    # Contractions and casing.
    "I'm sure you'll see they've done it, haven't they? She'd LOVE IT'S OK",
    "don't DON'T Don'T rock'n'roll",
    # Code.
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{v:?}\");\n}\n",
    "def f(x):\n\treturn {'a': [1, 2, 3], \"b\": None}  # comment\n",
    "<div class=\"x\">&nbsp;</div><!-- html -->",
    "SELECT * FROM users WHERE id = 1;",
    "if (a <= b && c != d) { x += 1; } // ok",
    # Long repetitions.
    "a" * 200,
    "!" * 64,
    "ab" * 50,
]

CHAT_CASES = [
    {
        "name": "user_only",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "add_generation_prompt": True,
    },
    {
        "name": "system_user",
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Say hi."},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "multi_turn_no_prompt",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke about ünïcödé."},
        ],
        "add_generation_prompt": False,
    },
]


def read_inputs(paths):
    """Split llama.cpp's .inp files exactly like test-tokenizer-0.cpp does, deduplicating."""
    seen = set()
    out = []
    for path in paths:
        with open(path, encoding="utf-8", newline="") as f:
            raw = f.read()
        pos = 0
        while pos < len(raw):
            nxt = raw.find(SEP, pos)
            if nxt < 0:
                piece = raw[pos:]
                pos = len(raw)
            else:
                piece = raw[pos:nxt]
                pos = nxt + len(SEP)
            if piece not in seen:
                seen.add(piece)
                out.append(piece)
    return out


def detokenize(llama_cpp, vocab, ids, unparse_special):
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
    if n < 0:
        raise RuntimeError(f"detokenize buffer too small ({-n} > {size})")
    return buf.raw[:n]


def render_chat(template, case, bos, eos):
    import jinja2
    import jinja2.sandbox

    # The environment transformers' apply_chat_template uses.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=case["messages"],
        add_generation_prompt=case["add_generation_prompt"],
        bos_token=bos,
        eos_token=eos,
    )


def dump_compact(fixture):
    """Pretty JSON with one case per line: reviewable diffs without one id per line."""
    parts = []
    for key, value in fixture.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = ",\n".join("  " + json.dumps(v, ensure_ascii=False) for v in value)
            parts.append(f" {json.dumps(key)}: [\n{items}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="SmolLM2 GGUF file")
    ap.add_argument("--inp", action="append", default=[], help="llama.cpp ggml-vocab-*.gguf.inp file (repeatable)")
    ap.add_argument("--out", required=True, help="fixture JSON to write")
    args = ap.parse_args()

    import llama_cpp

    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    inputs = read_inputs(args.inp)
    n_suite = len(inputs)
    for extra in EXTRA_INPUTS:
        if extra not in inputs:
            inputs.append(extra)

    cases = []
    for text in inputs:
        for special in (False, True):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            cases.append(
                {
                    "text": text,
                    "special": special,
                    "ids": ids,
                    "decoded": detokenize(llama_cpp, vocab, ids, False).decode("utf-8"),
                    "decoded_special": detokenize(llama_cpp, vocab, ids, True).decode("utf-8"),
                }
            )

    # Digest of every token's piece (llama_token_to_piece, lstrip 0), length-prefixed so that
    # boundaries count.
    digests = {}
    for special in (False, True):
        h = hashlib.sha256()
        buf = ctypes.create_string_buffer(256)
        for tid in range(n_vocab):
            n = llama_cpp.llama_token_to_piece(vocab, tid, buf, 256, 0, special)
            if n < 0:
                raise RuntimeError(f"piece of token {tid} longer than 256 bytes")
            piece = buf.raw[:n]
            h.update(len(piece).to_bytes(4, "little"))
            h.update(piece)
        digests["special" if special else "plain"] = h.hexdigest()

    eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    bos = llama_cpp.llama_vocab_bos(vocab)
    eos = llama_cpp.llama_vocab_eos(vocab)

    def text_of(tid):
        return llama_cpp.llama_vocab_get_text(vocab, tid).decode("utf-8")

    template = llm.metadata.get("tokenizer.chat_template")
    chats = []
    if template:
        for case in CHAT_CASES:
            chats.append(dict(case, rendered=render_chat(template, case, text_of(bos), text_of(eos))))

    fixture = {
        "generator": "scripts/make-tokenizer-vectors.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": os.path.basename(args.model),
        "inputs_from": [os.path.basename(p) for p in args.inp],
        "suite_inputs": n_suite,
        "n_vocab": n_vocab,
        "bos": bos,
        "eos": eos,
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog": eog,
        "piece_sha256": digests,
        "cases": cases,
        "chat": chats,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(dump_compact(fixture))
    print(f"{len(cases)} cases ({n_suite} suite inputs x 2 + extras), eog={eog} -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
