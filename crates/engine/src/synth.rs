//! Random-weight models of every supported family, for tests and benchmarks without downloads.
//!
//! A synthetic model has its family's real metadata keys and tensor names, a real tokenizer
//! (copied from a model the store can fetch) and a chat template of the family, so every stage
//! a user's file goes through runs on it: llama.cpp loads it too, which is how the parity tests
//! get reference logits for families whose real weights cannot be downloaded here. Weights are
//! uniform noise scaled by `1/sqrt(fan_in)` (activations stay finite through many layers); norm
//! weights and biases are noise around their neutral value, so a swapped or skipped one changes
//! the output. Every quant type is written as llama.cpp's quantiser writes it (no importance matrix), so
//! the bytes are those `llama-quantize` would write from the f32 model ([`tensor_digest`]
//! checks this against a digest llama.cpp's file gave).

use sha2::{Digest, Sha256};
use strata_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};
use strata_kernels::formats::quantize_weights;

use crate::{Arch, Error, Result};

/// What to synthesise.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    /// The family.
    pub arch: Arch,
    /// Decoder layers.
    pub layers: usize,
    /// Model width.
    pub embd: usize,
    /// FFN width.
    pub ff: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width (default `embd / heads`).
    pub head_dim: Option<usize>,
    /// Type of the weight matrices (norms and biases stay f32).
    pub ty: GgmlType,
    /// Tensors of another type than `ty`, by name: a quantisation mix such as llama.cpp's
    /// `Q4_K_M` (whose reference file lists each tensor's type).
    pub tensor_types: Vec<(String, GgmlType)>,
    /// Noise seed.
    pub seed: u64,
    /// A sliding window on the family's window layers (`attention.sliding_window`): Gemma 2's
    /// and gpt-oss's (16 when not given), Gemma 3's, or OLMo 3's, which comes with YaRN
    /// scaling as OLMo 3 has it.
    pub sliding_window: Option<usize>,
    /// A chat template to carry instead of the family's (to try a model's own template).
    pub chat_template: Option<String>,
    /// Experts per layer and experts per token, for a mixture-of-experts family (default 8
    /// and 2); `ff` is then one expert's FFN width.
    pub experts: Option<(usize, usize)>,
    /// An embedding model's pooling (`ARCH.pooling_type`); with last-token pooling the
    /// tokenizer appends EOS too, as Qwen3-Embedding's does.
    pub pooling: Option<crate::embed::Pooling>,
}

/// A chat template in the Qwen2.5 / Qwen3 manner: ChatML turns, tools listed in the system turn
/// as JSON inside `<tools>`, calls as `<tool_call>` JSON, results as `<tool_response>`.
const QWEN_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant.{% endif %}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% else %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}
{%- for tc in message.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// Phi-3.5's chat template (it has no tool-call format of its own).
const PHI3_TEMPLATE: &str = "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";

/// A Mistral chat template in the manner of Mistral Small 3.2: system prompt in its own block,
/// tools listed before the last user turn, calls as `[TOOL_CALLS]NAME[ARGS]ARGUMENTS`, results in
/// `[TOOL_RESULTS]`. Its markers are control tokens, as in Mistral's vocabulary ([`FAMILY_TOKENS`]).
const MISTRAL_TEMPLATE: &str = r#"{{ bos_token }}{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for message in messages %}
{%- if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ message['content'] }}[/SYSTEM_PROMPT]
{%- elif message['role'] == 'user' %}{% if tools and loop.index0 == ns.last_user %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ message['content'] }}[/INST]
{%- elif message['role'] == 'assistant' %}{% if message['content'] %}{{ message['content'] }}{% endif %}
{%- for tc in message['tool_calls'] or [] %}[TOOL_CALLS]{{ tc['function']['name'] }}[ARGS]{% if tc['function']['arguments'] is string %}{{ tc['function']['arguments'] }}{% else %}{{ tc['function']['arguments'] | tojson }}{% endif %}{% endfor %}{{ eos_token }}
{%- elif message['role'] == 'tool' %}[TOOL_RESULTS]{{ message['content'] }}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}"#;

/// A Granite 3 chat template: role headers, tools as an `available_tools` turn, calls as
/// `<|tool_call|>` and a JSON list, results as `tool_response` turns.
const GRANITE_TEMPLATE: &str = r#"{%- if tools %}<|start_of_role|>available_tools<|end_of_role|>
{% for tool in tools %}{{ tool | tojson(indent=4) }}
{% endfor %}{{ eos_token }}
{% endif %}
{%- for message in messages %}
{%- if message['role'] == 'assistant' and message.tool_calls %}<|start_of_role|>assistant<|end_of_role|>{% if message['content'] %}{{ message['content'] }}{% endif %}<|tool_call|>[{% for tc in message.tool_calls %}{"name": {{ tc.function.name | tojson }}, "arguments": {{ tc.function.arguments | tojson }}}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{% elif message['role'] == 'tool' %}<|start_of_role|>tool_response<|end_of_role|>{{ message['content'] }}{{ eos_token }}
{% else %}<|start_of_role|>{{ message['role'] }}<|end_of_role|>{{ message['content'] }}{{ eos_token }}
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"#;

/// A chat template in gpt-oss's harmony format: system and developer messages (instructions,
/// and tools as a TypeScript-like namespace), messages as `<|start|>ROLE<|message|>…<|end|>`,
/// answers on the `final` channel, earlier calls as `commentary` messages to
/// `functions.NAME` ending in `<|call|>`, results as messages from that function.
const HARMONY_TEMPLATE: &str = r#"{%- set ns = namespace(call_name='') -%}
<|start|>system<|message|>You are a helpful assistant.
Reasoning: medium

# Valid channels: analysis, commentary, final. Channel must be included for every message.
{%- if tools %}
Calls to these tools must go to the commentary channel: 'functions'.
{%- endif %}<|end|>
{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' else none %}
{%- if sys or tools %}<|start|>developer<|message|>
{%- if sys %}# Instructions

{{ sys }}
{% endif %}
{%- if tools %}
# Tools

## functions

namespace functions {
{% for tool in tools %}
// {{ tool['function']['description'] }}
type {{ tool['function']['name'] }} = (_: {{ tool['function']['parameters'] | tojson }}) => any;
{% endfor %}
} // namespace functions
{%- endif %}<|end|>
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'user' %}<|start|>user<|message|>{{ message['content'] }}<|end|>
{%- elif message['role'] == 'assistant' %}
{%- if message['content'] %}<|start|>assistant<|channel|>final<|message|>{{ message['content'] }}<|end|>{% endif %}
{%- for tc in message['tool_calls'] or [] %}{% set ns.call_name = tc['function']['name'] %}<|start|>assistant to=functions.{{ tc['function']['name'] }}<|channel|>commentary json<|message|>{% if tc['function']['arguments'] is string %}{{ tc['function']['arguments'] }}{% else %}{{ tc['function']['arguments'] | tojson }}{% endif %}<|call|>
{%- endfor %}
{%- elif message['role'] == 'tool' %}<|start|>functions.{{ ns.call_name }} to=assistant<|channel|>commentary<|message|>{{ message['content'] }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"#;

/// The control tokens a family's template writes that the copied vocabulary lacks: they take
/// the place of its spare control tokens (same count, so the tensors keep their shapes).
const FAMILY_TOKENS: &[(Arch, &[&str])] = &[
    (
        Arch::Mistral3,
        &[
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "[TOOL_CALLS]",
            "[ARGS]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
        ],
    ),
    (
        Arch::Granite,
        &["<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"],
    ),
    (
        Arch::GptOss,
        &[
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|return|>",
            "<|call|>",
        ],
    ),
];

/// The chat template a synthetic model of `arch` carries, when it is not the copied one.
pub fn chat_template(arch: Arch) -> Option<&'static str> {
    match arch {
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen2Moe => Some(QWEN_TEMPLATE),
        Arch::Phi3 => Some(PHI3_TEMPLATE),
        Arch::Mistral3 => Some(MISTRAL_TEMPLATE),
        Arch::Olmo2 => Some(OLMO2_TEMPLATE),
        Arch::Granite => Some(GRANITE_TEMPLATE),
        Arch::GptOss => Some(HARMONY_TEMPLATE),
        Arch::Olmoe => Some(OLMO2_TEMPLATE),
        Arch::Llama | Arch::Gemma2 | Arch::Gemma3 | Arch::SmolLm3 | Arch::Deepseek2 => None,
    }
}

/// The copied vocabulary with the family's control tokens in place of spare ones (control
/// tokens no `tokenizer.ggml.*_token_id` key names), in id order; `None` when the vocabulary
/// has too few spare ones (the template's markers are then plain text).
fn family_vocabulary(arch: Arch, md: &strata_gguf::Metadata) -> Result<Option<Vec<String>>> {
    let Some((_, names)) = FAMILY_TOKENS.iter().find(|(a, _)| *a == arch) else {
        return Ok(None);
    };
    let (Some(Value::Array(Array::String(tokens))), Some(Value::Array(types))) = (
        md.get("tokenizer.ggml.tokens"),
        md.get("tokenizer.ggml.token_type"),
    ) else {
        return Err(Error::InvalidModel(
            "cannot synthesise: the tokenizer source has no token types".into(),
        ));
    };
    let named: Vec<usize> = md
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer.ggml.") && k.ends_with("_token_id"))
        .filter_map(|(_, v)| match v {
            Value::U32(id) => Some(*id as usize),
            Value::I32(id) => usize::try_from(*id).ok(),
            _ => None,
        })
        .collect();
    const CONTROL: i64 = 3;
    let type_of = |i: usize| match types {
        Array::I32(t) => t.get(i).map(|&x| i64::from(x)),
        Array::U32(t) => t.get(i).map(|&x| i64::from(x)),
        _ => None,
    };
    let spare = (0..tokens.len()).filter(|&i| type_of(i) == Some(CONTROL) && !named.contains(&i));
    let spare: Vec<usize> = spare.collect();
    if spare.len() < names.len() {
        // Too small a vocabulary (a fuzzing seed's): the markers stay plain text.
        return Ok(None);
    }
    let mut out = tokens.clone();
    for (&i, name) in spare.iter().zip(names.iter()) {
        out[i] = (*name).to_string();
    }
    Ok(Some(out))
}

/// OLMo 2 Instruct's chat template (`<|user|>` / `<|assistant|>` turns, plain text here).
const OLMO2_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}";

/// The latent-attention widths of a synthetic DeepSeek model, from its head width `hd`:
/// DeepSeek V3's proportions (nope 128, rope 64, values 128, latent 512, query rank 1536 at
/// `hd` 128) scaled down.
struct SynthMla {
    nope: usize,
    rope: usize,
    v_head: usize,
    kv_lora: usize,
    q_lora: usize,
}

impl SynthMla {
    fn of(hd: usize) -> SynthMla {
        SynthMla {
            nope: hd,
            rope: hd / 2,
            v_head: hd,
            kv_lora: 2 * hd,
            q_lora: 2 * hd,
        }
    }
}

struct Noise(u64);

impl Noise {
    /// Uniform values in [-scale, scale).
    fn fill(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

/// The types [`quantize_weights`] writes as llama.cpp's quantiser does.
pub const WRITABLE: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::MXFP4,
];

/// GGUF metadata of a byte-level SentencePiece vocabulary (every byte a token) plus ChatML's
/// markers.
pub fn byte_vocabulary() -> Vec<u8> {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    tokens.extend([
        "<|im_start|>".into(),
        "<|im_end|>".into(),
        "\u{2581}".into(),
    ]);
    let mut types = vec![2, 3, 3];
    types.extend(std::iter::repeat_n(6, 256));
    // The markers are control tokens; SentencePiece's space (U+2581) a normal one, as in every
    // real SentencePiece vocabulary.
    types.extend([3, 3, 1]);
    let mut w = GgufWriter::new();
    w.kv("tokenizer.ggml.model", Value::String("llama".into()));
    w.kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    w.kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    w.kv("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.kv("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.to_bytes()
}

/// Choices a converter makes for some families beyond the dimensions. The default is what
/// llama.cpp's `convert_hf_to_gguf.py` writes for the family's long-context checkpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynthLayout {
    /// Phi-3: separate `attn_q`, `attn_k` and `attn_v` rather than the fused `attn_qkv`
    /// (llama.cpp loads either).
    pub split_qkv: bool,
    /// Phi-3: no LongRoPE factors and no `rope.scaling.*` keys, as the 4k-context
    /// checkpoints' files have (six tensors a layer, three outside them).
    pub no_longrope: bool,
    /// A separate `output.weight` even where the family's converter ties the LM head to the
    /// embedding (a file written by other tools, `gguf-py` say): llama-quantize then gives the
    /// head its own type (Q6_K) and leaves `token_embd` in the base type, read through
    /// `get_rows`, a pairing a tied file never has.
    pub untied: bool,
}

/// Writes the model `spec` describes, with the tokenizer of `tokenizer_from`, as GGUF bytes.
pub fn synth(spec: &SynthSpec, tokenizer_from: &GgufFile) -> Result<Vec<u8>> {
    synth_with(spec, SynthLayout::default(), tokenizer_from)
}

/// [`synth`] with the tensors laid out as `layout` says.
pub fn synth_with(
    spec: &SynthSpec,
    layout: SynthLayout,
    tokenizer_from: &GgufFile,
) -> Result<Vec<u8>> {
    let s = spec;
    let (e, ff, nh, nkv) = (s.embd, s.ff, s.heads, s.kv_heads);
    let bad = |why: &str| Err(Error::InvalidModel(format!("cannot synthesise: {why}")));
    if s.layers == 0 || nh == 0 || nkv == 0 || !nh.is_multiple_of(nkv) {
        return bad("need layers >= 1 and heads a multiple of kv-heads");
    }
    let hd = match s.head_dim {
        Some(hd) => hd,
        None if e.is_multiple_of(nh) => e / nh,
        None => return bad("embd must be a multiple of heads (or give a head width)"),
    };
    for ty in std::iter::once(s.ty).chain(s.tensor_types.iter().map(|(_, t)| *t)) {
        let block = ty.block_size();
        if !e.is_multiple_of(block) || !ff.is_multiple_of(block) || !(nh * hd).is_multiple_of(block)
        {
            return bad(&format!(
                "embd, ff and heads x head width must be multiples of {block} ({ty} blocks)"
            ));
        }
        if !WRITABLE.contains(&ty) {
            return bad(&format!("cannot write {ty} tensors"));
        }
    }
    if hd % 2 != 0 {
        return bad("the head width must be even (RoPE rotates pairs)");
    }
    let mla = (s.arch == Arch::Deepseek2).then(|| SynthMla::of(hd));
    if mla.is_some() && nkv != 1 {
        return bad("latent attention has one KV head (--kv-heads 1)");
    }
    // Per-head widths: RoPE's, the attention output's.
    let rope_dims = mla.as_ref().map_or(hd, |m| m.rope);
    let v_head = mla.as_ref().map_or(hd, |m| m.v_head);
    let md = tokenizer_from.metadata();
    let vocab = match md.get("tokenizer.ggml.tokens") {
        Some(Value::Array(Array::String(t))) => t.len(),
        _ => return bad("the tokenizer source has no vocabulary"),
    };
    let arch = s.arch.name();
    let mut w = GgufWriter::new();
    let k = |key: &str| format!("{arch}.{key}");
    w.kv("general.architecture", Value::String(arch.into()))
        .kv(
            "general.name",
            Value::String(format!(
                // Not the family's name: llama.cpp keys vocabulary quirks on it (for Phi-3,
                // tokens this copied vocabulary lacks).
                "synthetic {}L {e}x{ff} {nh}/{nkv} heads {}",
                s.layers, s.ty
            )),
        )
        .kv(&k("block_count"), Value::U32(s.layers as u32))
        .kv(&k("context_length"), Value::U32(4096))
        .kv(&k("embedding_length"), Value::U32(e as u32))
        .kv(&k("feed_forward_length"), Value::U32(ff as u32))
        .kv(&k("attention.head_count"), Value::U32(nh as u32))
        .kv(&k("attention.head_count_kv"), Value::U32(nkv as u32))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .kv(
            &k("rope.freq_base"),
            // Mistral 3's YaRN ramp spans more pairs of a small head at a lower base.
            Value::F32(if s.arch == Arch::Mistral3 {
                10_000.0
            } else {
                1_000_000.0
            }),
        )
        .kv(&k("rope.dimension_count"), Value::U32(rope_dims as u32));
    let longrope = s.arch == Arch::Phi3 && !layout.no_longrope;
    if longrope {
        // LongRoPE: factors for within and beyond the original context, and its magnitude.
        w.kv(&k("rope.scaling.attn_factor"), Value::F32(1.190_238))
            .kv(&k("rope.scaling.original_context_length"), Value::U32(4096));
    }
    if s.arch == Arch::Gemma2 {
        // Caps low enough that tanh bends the synthetic scores and logits, and a window short
        // enough that the test prompts reach past it.
        w.kv(&k("attn_logit_softcapping"), Value::F32(10.0))
            .kv(&k("final_logit_softcapping"), Value::F32(8.0))
            .kv(
                &k("attention.sliding_window"),
                Value::U32(s.sliding_window.unwrap_or(16) as u32),
            );
    }
    if s.arch == Arch::Granite {
        // Granite 3's multipliers, of the sizes its 2B model has.
        w.kv(&k("embedding_scale"), Value::F32(12.0))
            .kv(&k("attention.scale"), Value::F32(0.015_625))
            .kv(&k("residual_scale"), Value::F32(0.22))
            .kv(&k("logit_scale"), Value::F32(8.0));
    }
    let moe = matches!(
        s.arch,
        Arch::Qwen3Moe | Arch::GptOss | Arch::Olmoe | Arch::Qwen2Moe | Arch::Deepseek2
    )
    .then(|| s.experts.unwrap_or((8, 2)));
    if let Some((nx, used)) = moe {
        if used == 0 || used > nx {
            return bad("experts per token must be between 1 and the expert count");
        }
        w.kv(&k("expert_count"), Value::U32(nx as u32))
            .kv(&k("expert_used_count"), Value::U32(used as u32))
            .kv(&k("expert_feed_forward_length"), Value::U32(ff as u32));
        if s.arch == Arch::Qwen2Moe {
            // The shared expert: twice an expert's width.
            w.kv(
                &k("expert_shared_feed_forward_length"),
                Value::U32(2 * ff as u32),
            );
        }
    }
    if s.arch == Arch::Mistral3 {
        // YaRN as Ministral 3 has it (its `mscale_all_dim` of 1 as the log multiplier), over an
        // original context short enough that the test prompts reach past it, where the
        // attention temperature starts to grow.
        w.kv(&k("rope.scaling.type"), Value::String("yarn".into()))
            .kv(&k("rope.scaling.factor"), Value::F32(16.0))
            .kv(&k("rope.scaling.original_context_length"), Value::U32(32))
            .kv(&k("rope.scaling.yarn_beta_fast"), Value::F32(32.0))
            .kv(&k("rope.scaling.yarn_beta_slow"), Value::F32(1.0))
            .kv(&k("rope.scaling.yarn_log_multiplier"), Value::F32(1.0))
            .kv(&k("attention.temperature_scale"), Value::F32(0.1));
    }
    if let (Arch::Gemma3, Some(window)) = (s.arch, s.sliding_window) {
        // Gemma 3's window on five layers of every six (the file's default pattern).
        w.kv(&k("attention.sliding_window"), Value::U32(window as u32));
    }
    if let (Arch::Olmo2, Some(window)) = (s.arch, s.sliding_window) {
        // OLMo 3: window layers rotate plainly, the global ones with YaRN (over an original
        // context the test prompts pass, so the ramp and the magnitude matter).
        w.kv(&k("attention.sliding_window"), Value::U32(window as u32))
            .kv(&k("rope.scaling.type"), Value::String("yarn".into()))
            .kv(&k("rope.scaling.factor"), Value::F32(8.0))
            .kv(&k("rope.scaling.original_context_length"), Value::U32(32));
    }
    if s.arch == Arch::GptOss {
        // The released files' YaRN (32 times a 4096-token context), and a window short enough
        // that the test prompts reach past it.
        w.kv(
            &k("attention.sliding_window"),
            Value::U32(s.sliding_window.unwrap_or(16) as u32),
        )
        .kv(&k("rope.scaling.type"), Value::String("yarn".into()))
        .kv(&k("rope.scaling.factor"), Value::F32(32.0))
        .kv(&k("rope.scaling.original_context_length"), Value::U32(4096));
    }
    if let (Some(m), Some((nx, used))) = (&mla, moe) {
        // DeepSeek V3's structure scaled down: a low-rank query, the latent KV row, one dense
        // layer first, sigmoid routing over groups of experts steered by a selection bias,
        // renormalised and scaled weights, one shared expert, and its YaRN.
        let groups = if nx % 4 == 0 && nx >= 8 && used <= nx / 2 {
            4
        } else {
            1
        };
        w.kv(
            &k("attention.key_length"),
            Value::U32((m.kv_lora + m.rope) as u32),
        )
        .kv(&k("attention.value_length"), Value::U32(m.kv_lora as u32))
        .kv(
            &k("attention.key_length_mla"),
            Value::U32((m.nope + m.rope) as u32),
        )
        .kv(
            &k("attention.value_length_mla"),
            Value::U32(m.v_head as u32),
        )
        .kv(&k("attention.q_lora_rank"), Value::U32(m.q_lora as u32))
        .kv(&k("attention.kv_lora_rank"), Value::U32(m.kv_lora as u32))
        .kv(&k("leading_dense_block_count"), Value::U32(1))
        .kv(&k("expert_shared_count"), Value::U32(1))
        .kv(&k("expert_weights_scale"), Value::F32(2.5))
        .kv(&k("expert_weights_norm"), Value::Bool(true))
        .kv(&k("expert_gating_func"), Value::U32(2))
        .kv(&k("expert_group_count"), Value::U32(groups))
        .kv(
            &k("expert_group_used_count"),
            Value::U32(groups.div_ceil(2)),
        )
        .kv(&k("rope.scaling.type"), Value::String("yarn".into()))
        .kv(&k("rope.scaling.factor"), Value::F32(40.0))
        .kv(&k("rope.scaling.original_context_length"), Value::U32(4096))
        .kv(&k("rope.scaling.yarn_log_multiplier"), Value::F32(0.1));
    } else if s.head_dim.is_some() {
        w.kv(&k("attention.key_length"), Value::U32(hd as u32))
            .kv(&k("attention.value_length"), Value::U32(hd as u32));
    }
    // Qwen's own split rules on the copied vocabulary, so both tokenizers exercise them, and a
    // template of the family.
    let mut overrides: Vec<(&str, Value)> = Vec::new();
    if matches!(
        s.arch,
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen2Moe
    ) {
        overrides.push(("tokenizer.ggml.pre", Value::String("qwen2".into())));
    }
    if let Some(p) = s.pooling {
        w.kv(&k("pooling_type"), Value::U32(p.gguf_code()));
    }
    if s.pooling == Some(crate::embed::Pooling::Last) {
        overrides.push(("tokenizer.ggml.add_eos_token", Value::Bool(true)));
    }
    if let Some(t) = s.chat_template.as_deref().or(chat_template(s.arch)) {
        overrides.push(("tokenizer.chat_template", Value::String(t.into())));
    }
    if let Some(tokens) = family_vocabulary(s.arch, md)? {
        overrides.push(("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))));
    }
    for (key, v) in md.iter() {
        if key.starts_with("tokenizer.") && !overrides.iter().any(|(k, _)| *k == key) {
            w.kv(key, v.clone());
        }
    }
    for (key, v) in overrides {
        w.kv(key, v);
    }

    let mut noise = Noise(s.seed.max(1));
    let n_expert = moe.map_or(1, |(nx, _)| nx);
    // A matrix of `rows` rows of `cols`; an expert tensor holds `rows` rows per expert, and a
    // router (`rows` 0) one row per expert, in f32.
    // The first matrix whose rows its type cannot quantise (refused once all are written).
    let mut misfit: Option<String> = None;
    let mut matrix = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize| {
        let router = name.ends_with("ffn_gate_inp.weight");
        let ty = s
            .tensor_types
            .iter()
            .find(|(n, _)| n == name)
            .map_or(if router { GgmlType::F32 } else { s.ty }, |(_, t)| *t);
        let dims: Vec<u64> = if router {
            vec![cols as u64, n_expert as u64]
        } else if name.ends_with("_exps.weight") {
            vec![cols as u64, rows as u64, n_expert as u64]
        } else if name.ends_with("attn_k_b.weight") || name.ends_with("attn_v_b.weight") {
            // One matrix per query head.
            vec![cols as u64, rows as u64, nh as u64]
        } else {
            vec![cols as u64, rows as u64]
        };
        let count = dims.iter().product::<u64>() as usize;
        let x = noise.fill(count, 1.0 / (cols as f32).sqrt());
        if !cols.is_multiple_of(ty.block_size()) {
            misfit.get_or_insert_with(|| {
                format!("{name}'s rows of {cols} are not whole {ty} blocks")
            });
        }
        w.tensor(name, &dims, ty, quantize_weights(ty, &x));
    };
    let mut vec_noise = Noise(s.seed.max(1) ^ 0x9E37_79B9_7F4A_7C15);
    // A float tensor of `dims` (a vector, or a bias per expert) of noise around `centre`.
    let mut vector = |w: &mut GgufWriter, name: &str, dims: &[usize], centre: f32, spread: f32| {
        let v: Vec<f32> = vec_noise
            .fill(dims.iter().product(), spread)
            .into_iter()
            .map(|x| x + centre)
            .collect();
        w.tensor(
            name,
            &dims.iter().map(|&d| d as u64).collect::<Vec<_>>(),
            GgmlType::F32,
            quantize_weights(GgmlType::F32, &v),
        );
    };
    matrix(&mut w, "token_embd.weight", e, vocab);
    vector(&mut w, "output_norm.weight", &[e], 1.0, 0.2);
    if layout.untied
        || matches!(
            s.arch,
            Arch::Olmo2 | Arch::GptOss | Arch::Olmoe | Arch::Qwen2Moe
        )
    {
        // llama.cpp requires these families' own LM head.
        matrix(&mut w, "output.weight", e, vocab);
    }
    if longrope {
        vector(&mut w, "rope_factors_short.weight", &[hd / 2], 1.5, 0.5);
        vector(&mut w, "rope_factors_long.weight", &[hd / 2], 8.0, 4.0);
    }
    for l in 0..s.layers {
        let n = |t: &str| format!("blk.{l}.{t}");
        if s.arch == Arch::GptOss {
            // gpt-oss names the FFN's input norm `post_attention_norm`.
            vector(&mut w, &n("attn_norm.weight"), &[e], 1.0, 0.2);
            vector(&mut w, &n("post_attention_norm.weight"), &[e], 1.0, 0.2);
        } else if s.arch != Arch::Olmo2 {
            vector(&mut w, &n("attn_norm.weight"), &[e], 1.0, 0.2);
            vector(&mut w, &n("ffn_norm.weight"), &[e], 1.0, 0.2);
        }
        if let Some(m) = &mla {
            vector(&mut w, &n("attn_q_a_norm.weight"), &[m.q_lora], 1.0, 0.2);
            vector(&mut w, &n("attn_kv_a_norm.weight"), &[m.kv_lora], 1.0, 0.2);
            matrix(&mut w, &n("attn_q_a.weight"), e, m.q_lora);
            matrix(
                &mut w,
                &n("attn_q_b.weight"),
                m.q_lora,
                nh * (m.nope + m.rope),
            );
            matrix(&mut w, &n("attn_kv_a_mqa.weight"), e, m.kv_lora + m.rope);
            matrix(&mut w, &n("attn_k_b.weight"), m.nope, m.kv_lora);
            matrix(&mut w, &n("attn_v_b.weight"), m.kv_lora, m.v_head);
        } else if s.arch == Arch::Phi3 && !layout.split_qkv {
            // One fused tensor: Q's rows, then K's, then V's.
            matrix(&mut w, &n("attn_qkv.weight"), e, (nh + 2 * nkv) * hd);
        } else {
            matrix(&mut w, &n("attn_q.weight"), e, nh * hd);
            matrix(&mut w, &n("attn_k.weight"), e, nkv * hd);
            matrix(&mut w, &n("attn_v.weight"), e, nkv * hd);
        }
        if matches!(s.arch, Arch::Qwen2 | Arch::GptOss | Arch::Qwen2Moe) {
            vector(&mut w, &n("attn_q.bias"), &[nh * hd], 0.0, 0.5);
            vector(&mut w, &n("attn_k.bias"), &[nkv * hd], 0.0, 0.5);
            vector(&mut w, &n("attn_v.bias"), &[nkv * hd], 0.0, 0.5);
        }
        if matches!(s.arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3) {
            vector(&mut w, &n("attn_q_norm.weight"), &[hd], 1.0, 0.3);
            vector(&mut w, &n("attn_k_norm.weight"), &[hd], 1.0, 0.3);
        }
        if matches!(s.arch, Arch::Olmo2 | Arch::Olmoe) {
            // Over whole Q and K rows, not per head.
            vector(&mut w, &n("attn_q_norm.weight"), &[nh * hd], 1.0, 0.3);
            vector(&mut w, &n("attn_k_norm.weight"), &[nkv * hd], 1.0, 0.3);
        }
        if matches!(s.arch, Arch::Gemma2 | Arch::Gemma3 | Arch::Olmo2) {
            vector(&mut w, &n("post_attention_norm.weight"), &[e], 1.0, 0.2);
            vector(&mut w, &n("post_ffw_norm.weight"), &[e], 1.0, 0.2);
        }
        matrix(&mut w, &n("attn_output.weight"), nh * v_head, e);
        if s.arch == Arch::GptOss {
            // Sinks of a size that takes a real share of each head's attention, and biases.
            vector(&mut w, &n("attn_output.bias"), &[e], 0.0, 0.5);
            vector(&mut w, &n("attn_sinks.weight"), &[nh], 0.0, 2.0);
        }
        // DeepSeek's first layer is dense.
        if moe.is_some() && !(mla.is_some() && l == 0) {
            // The router (f32, as llama.cpp's quantiser leaves it) and 3-D expert tensors.
            matrix(&mut w, &n("ffn_gate_inp.weight"), e, 0);
            matrix(&mut w, &n("ffn_gate_exps.weight"), e, ff);
            matrix(&mut w, &n("ffn_up_exps.weight"), e, ff);
            matrix(&mut w, &n("ffn_down_exps.weight"), ff, e);
            if mla.is_some() {
                // The selection bias, of a size that changes choices, and a shared expert.
                vector(&mut w, &n("exp_probs_b.bias"), &[n_expert], 0.0, 0.3);
                matrix(&mut w, &n("ffn_gate_shexp.weight"), e, ff);
                matrix(&mut w, &n("ffn_up_shexp.weight"), e, ff);
                matrix(&mut w, &n("ffn_down_shexp.weight"), ff, e);
            }
            if s.arch == Arch::Qwen2Moe {
                // The shared expert and its gate vector (f32, 1-D, as llama.cpp leaves it).
                vector(&mut w, &n("ffn_gate_inp_shexp.weight"), &[e], 0.0, 0.2);
                matrix(&mut w, &n("ffn_gate_shexp.weight"), e, 2 * ff);
                matrix(&mut w, &n("ffn_up_shexp.weight"), e, 2 * ff);
                matrix(&mut w, &n("ffn_down_shexp.weight"), 2 * ff, e);
            }
            if s.arch == Arch::GptOss {
                // gpt-oss's router and experts have biases (one row per expert).
                vector(&mut w, &n("ffn_gate_inp.bias"), &[n_expert], 0.0, 0.5);
                for (t, rows) in [
                    ("ffn_gate_exps", ff),
                    ("ffn_up_exps", ff),
                    ("ffn_down_exps", e),
                ] {
                    vector(
                        &mut w,
                        &n(&format!("{t}.bias")),
                        &[rows, n_expert],
                        0.0,
                        0.3,
                    );
                }
            }
            continue;
        }
        if s.arch == Arch::Phi3 {
            // One fused tensor: the gate's rows, then the up projection's.
            matrix(&mut w, &n("ffn_up.weight"), e, 2 * ff);
        } else {
            matrix(&mut w, &n("ffn_gate.weight"), e, ff);
            matrix(&mut w, &n("ffn_up.weight"), e, ff);
        }
        matrix(&mut w, &n("ffn_down.weight"), ff, e);
    }
    if let Some(why) = misfit {
        return bad(&why);
    }
    Ok(w.to_bytes())
}

/// A digest of a file's weights: SHA-256 over every tensor, in name order, of its name, type
/// id and data. Two files with the same digest hold the same weights, whatever their metadata
/// (`scripts/make-reference.py` computes the same digest of llama.cpp's quantised file).
pub fn tensor_digest(file: &GgufFile) -> String {
    let mut tensors: Vec<_> = file.tensors().iter().collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut h = Sha256::new();
    for t in tensors {
        h.update(t.name.as_bytes());
        h.update([0]);
        h.update(t.ggml_type.id().to_le_bytes());
        h.update(file.tensor_data(t));
    }
    h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}
