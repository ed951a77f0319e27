//! The tokens llmgw makes of a request equal those Hugging Face
//! transformers makes (what vLLM and SGLang run), on model directories and
//! expectations written by `scripts/tokenizer/make_fixtures.py`.

use std::path::PathBuf;

use llmgw_tokenizer::{ChatRequest, ModelTokenizer, PromptFields};
use serde::Deserialize;
use serde_json::value::RawValue;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// `<model>.expected.json`; requests stay as written (their key order is
/// part of what `tojson` must reproduce).
#[derive(Deserialize)]
struct Expected {
    chat: Vec<ChatCase>,
    prompt: Vec<PromptCase>,
}

#[derive(Deserialize)]
struct ChatCase {
    name: String,
    request: Box<RawValue>,
    expect: Expect,
}

#[derive(Deserialize)]
struct Expect {
    text: Option<String>,
    ids: Option<Vec<u32>>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct PromptCase {
    prompt: String,
    ids: Vec<u32>,
}

fn check_model(name: &str) -> usize {
    let tokenizer = ModelTokenizer::load(&fixtures().join(name)).expect("the fixture model loads");
    let text = std::fs::read_to_string(fixtures().join(format!("{name}.expected.json"))).unwrap();
    let expected: Expected = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for case in &expected.chat {
        let label = &case.name;
        let fields: PromptFields<'_> = serde_json::from_str(case.request.get()).unwrap();
        let chat: ChatRequest<'_> = fields.chat().unwrap().expect("a chat request");
        match (&case.expect.error, &case.expect.text, &case.expect.ids) {
            (Some(error), _, _) => {
                let err = fields.token_ids(&tokenizer).expect_err(label).to_string();
                assert!(err.contains(error.as_str()), "{name}/{label}: {err}");
            }
            (None, Some(text), Some(ids)) => {
                let rendered = tokenizer
                    .render_chat(&chat)
                    .unwrap_or_else(|e| panic!("{name}/{label}: {e}"));
                assert_eq!(&rendered, text, "{name}/{label}: rendered text");
                assert_eq!(
                    &fields.token_ids(&tokenizer).unwrap(),
                    ids,
                    "{name}/{label}: ids"
                );
            }
            _ => panic!("{name}/{label}: the fixture has neither an error nor text and ids"),
        }
        checked += 1;
    }
    for case in &expected.prompt {
        assert_eq!(
            tokenizer.prompt_ids(&case.prompt).unwrap(),
            case.ids,
            "{name}: prompt"
        );
        checked += 1;
    }
    checked
}

#[test]
fn chat_templates_render_and_encode_as_transformers_does() {
    assert_eq!(check_model("chatml-bpe"), 7);
    assert_eq!(check_model("llama-bpe"), 4);
}

#[test]
fn tool_call_arguments_written_as_a_json_string_render_as_the_object() {
    let tokenizer = ModelTokenizer::load(&fixtures().join("chatml-bpe")).unwrap();
    let with = |arguments: &str| {
        let messages = format!(
            r#"[{{"role": "user", "content": "Weather?"}}, {{"role": "assistant", "content": null, "tool_calls": [{{"id": "c", "type": "function", "function": {{"name": "get_weather", "arguments": {arguments}}}}}]}}]"#
        );
        tokenizer
            .render_chat(&ChatRequest {
                messages: &messages,
                add_generation_prompt: false,
                ..Default::default()
            })
            .unwrap()
    };
    let as_object = with(r#"{"city": "Paris"}"#);
    assert!(
        as_object.contains(r#""arguments": {"city": "Paris"}"#),
        "{as_object}"
    );
    assert_eq!(with(r#""{\"city\": \"Paris\"}""#), as_object);
}

#[test]
fn a_continued_final_message_ends_the_prompt() {
    let tokenizer = ModelTokenizer::load(&fixtures().join("chatml-bpe")).unwrap();
    let text = tokenizer
        .render_chat(&ChatRequest {
            messages: r#"[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}]"#,
            add_generation_prompt: true,
            continue_final_message: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nHi<|im_end|><|im_start|>assistant\nHello, I am"
    );
}

#[test]
fn what_it_cannot_tokenize_is_an_error_naming_why() {
    let tokenizer = ModelTokenizer::load(&fixtures().join("chatml-bpe")).unwrap();
    let parts = tokenizer
        .chat_ids(&ChatRequest {
            messages: r#"[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]"#,
            add_generation_prompt: true,
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        parts.to_string().contains("content other than text"),
        "{parts}"
    );
    let missing = ModelTokenizer::load(&fixtures().join("no-such-model"))
        .err()
        .unwrap();
    assert!(
        missing.to_string().contains("no-such-model/tokenizer.json"),
        "{missing}"
    );
}
