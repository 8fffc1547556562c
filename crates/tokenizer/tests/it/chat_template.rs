//! SmolLM2's chat template, rendered by hand-written expectation and against Python jinja2's
//! rendering of the same conversations (stored in the fixture by make-tokenizer-vectors.py).
#![allow(clippy::unwrap_used)]

use crate::common;

use strata_tokenizer::{ChatMessage, ChatTemplate, RenderOptions, Tokenizer};

fn template() -> ChatTemplate {
    ChatTemplate::from_gguf(common::smollm2().metadata())
        .unwrap()
        .expect("SmolLM2 ships a chat template")
}

#[test]
fn user_only_gets_the_default_system_prompt() {
    let out = template()
        .render(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\n\
         You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\n\
         What is the capital of France?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn system_and_user_keep_the_given_system_prompt() {
    let msgs = [
        ChatMessage::new("system", "You are a terse assistant."),
        ChatMessage::new("user", "Say hi."),
    ];
    let t = template();
    assert_eq!(
        t.render(&msgs, true).unwrap(),
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n\
         <|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&msgs, false).unwrap(),
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n\
         <|im_start|>user\nSay hi.<|im_end|>\n"
    );
}

#[test]
fn renders_like_python_jinja2() {
    let t = template();
    let fx = common::fixture("smollm2");
    let chats = fx["chat"].as_array().unwrap();
    assert!(!chats.is_empty());
    for case in chats {
        let msgs: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let opts = RenderOptions::new()
            .generation_prompt(case["add_generation_prompt"].as_bool().unwrap());
        let got = t.render_with(&msgs, &opts).unwrap();
        assert_eq!(got, case["rendered"].as_str().unwrap(), "{}", case["name"]);
    }
}

#[test]
fn rendered_prompt_tokenizes_with_control_tokens() {
    let file = common::smollm2();
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let prompt = template()
        .render(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    let ids = tok.encode_prompt(&prompt, true).unwrap();
    assert_eq!(
        ids.iter().filter(|&&id| id == 1).count(),
        3,
        "three <|im_start|>"
    );
    assert_eq!(
        ids.iter().filter(|&&id| id == 2).count(),
        2,
        "two <|im_end|>"
    );
}
