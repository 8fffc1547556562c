"""Drives a running `strata serve` through litellm's Ollama providers, which send their JSON
bodies without a Content-Type: `ollama_chat/` (Ollama's /api/chat) and `ollama/` (/api/generate).

Environment and report: see harness.py.
"""
import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no download of litellm's price list

import litellm
from harness import MODEL, PROMPT, URL, check, run

KEY = os.environ["STRATA_KEY"]
KEYED = os.environ["STRATA_KEYED_URL"]


def ask(provider, base, **extra):
    return litellm.completion(
        model=f"{provider}/{MODEL}",
        api_base=base,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=24,
        temperature=0,
        timeout=120,
        **extra,
    )


@check
def ollama_chat_answers_greedily_as_strata_run():
    r = ask("ollama_chat", URL)
    assert r.choices[0].message.content == os.environ["STRATA_RUN_TEXT"], r.choices[0].message.content
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens == 24, r.usage


@check
def ollama_chat_streams():
    chunks = [c.choices[0].delta.content or "" for c in ask("ollama_chat", URL, stream=True)]
    assert "".join(chunks) == os.environ["STRATA_RUN_TEXT"], chunks


@check
def ollama_generate_answers():
    r = ask("ollama", URL)
    assert r.choices[0].message.content, r


@check
def a_key_passes_as_a_bearer_header():
    r = ask("ollama_chat", KEYED, extra_headers={"Authorization": f"Bearer {KEY}"})
    assert r.choices[0].message.content == os.environ["STRATA_RUN_TEXT"], r.choices[0].message.content


run()
