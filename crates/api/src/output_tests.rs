//! The output reader: stop sequences, tool calls in each syntax, harmony channels.
#![allow(clippy::unwrap_used)]

mod plain {
    use super::super::*;

    fn out(stops: &[&str], tools: bool) -> Output {
        let format = tools.then_some(CallFormat::Hermes);
        Output::new(stops.iter().map(|s| s.to_string()).collect(), format)
    }

    fn feed(o: &mut Output, parts: &[&str]) -> Vec<Piece> {
        let mut v = Vec::new();
        for p in parts {
            v.extend(o.push(p, None));
        }
        v.extend(o.finish(""));
        v
    }

    fn text_of(v: &[Piece]) -> String {
        v.iter()
            .filter_map(|p| match p {
                Piece::Content(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn stop_sequences_cut_even_across_tokens() {
        let mut o = out(&["END"], false);
        let v = feed(&mut o, &["hello E", "N", "D world"]);
        assert_eq!(text_of(&v), "hello ");
        assert!(o.stopped);
        let mut o = out(&["END"], false);
        let v = feed(&mut o, &["hello E", "N", "d"]);
        assert_eq!(text_of(&v), "hello ENd");
    }

    #[test]
    fn tool_calls_split_from_content() {
        let mut o = out(&[], true);
        let v = feed(
            &mut o,
            &[
                "Sure. <tool",
                "_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>\n<tool_call>{\"name\": \"g\", ",
                "\"arguments\": {}}</tool_call>",
            ],
        );
        assert_eq!(text_of(&v), "Sure.");
        let calls: Vec<_> = v
            .iter()
            .filter_map(|p| match p {
                Piece::Call(i, c) => Some((*i, c.name.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(calls, vec![(0, "f".to_string()), (1, "g".to_string())]);
    }

    #[test]
    fn a_call_cut_short_is_dropped_not_broken() {
        let mut o = out(&[], true);
        let v = feed(&mut o, &["<tool_call>{\"name\": \"f\", \"argu"]);
        assert!(v.is_empty(), "{v:?}");
        assert!(o.calls.is_empty());
        assert!(o.cut_call);
    }

    /// Per call index: the name given out and the joined argument pieces.
    fn streamed_calls(v: &[Piece]) -> Vec<(String, String)> {
        let mut calls: Vec<(String, String)> = Vec::new();
        for p in v {
            match p {
                Piece::CallStart(i, name) => {
                    assert_eq!(*i, calls.len(), "calls start in order");
                    calls.push((name.clone(), String::new()));
                }
                Piece::CallArgs(i, t) => calls[*i].1.push_str(t),
                _ => {}
            }
        }
        calls
    }

    #[test]
    fn call_arguments_stream_piece_by_piece_and_join_into_the_call() {
        let args0 = r#"{"a": "}\"{ é", "b": [1, {"c": 2}], "d": -1.5e3}"#;
        let args1 = "{}";
        let text = format!(
            "Let me see. <tool_call>{{\"name\": \"f\", \"arguments\": {args0}}}</tool_call>\n<tool_call>{{\"name\": \"g-2\", \"arguments\": {args1}}}</tool_call>"
        );
        // One character at a time, as the smallest tokens would arrive.
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
        let mut o = out(&[], true);
        let v = feed(&mut o, &parts);
        assert_eq!(text_of(&v), "Let me see.");
        let args_pieces = v
            .iter()
            .filter(|p| matches!(p, Piece::CallArgs(0, _)))
            .count();
        assert!(args_pieces > 10, "arguments arrive in pieces: {v:?}");
        assert_eq!(
            streamed_calls(&v),
            vec![("f".into(), args0.into()), ("g-2".into(), args1.into())]
        );
        assert_eq!(o.calls.len(), 2);
        assert_eq!(o.calls[0].arguments, args0);
        assert_eq!(o.calls[1].name, "g-2");
        assert!(!o.cut_call);
        // Each call's name comes before its arguments, and the finished call after both.
        let first_start = v.iter().position(|p| matches!(p, Piece::CallStart(0, _)));
        let first_args = v.iter().position(|p| matches!(p, Piece::CallArgs(0, _)));
        let first_done = v.iter().position(|p| matches!(p, Piece::Call(0, _)));
        assert!(first_start < first_args && first_args < first_done);
    }

    #[test]
    fn a_call_cut_inside_its_arguments_is_marked_cut() {
        let mut o = out(&[], true);
        let v = feed(
            &mut o,
            &["<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": \"ab"],
        );
        assert_eq!(
            streamed_calls(&v),
            vec![("f".into(), "{\"x\": \"ab".into())]
        );
        assert!(o.calls.is_empty());
        assert!(o.cut_call);
    }

    #[test]
    fn text_after_the_calls_is_not_given_out() {
        let mut o = out(&[], true);
        let v = feed(
            &mut o,
            &[
                "<tool_call>{\"name\": \"f\", \"arguments\": 7}</tool_call>",
                " and more",
            ],
        );
        assert_eq!(streamed_calls(&v), vec![("f".into(), "7".into())]);
        assert_eq!(text_of(&v), "");
        assert!(!o.cut_call);
    }

    #[test]
    fn the_value_scanner_ends_where_the_json_value_does() {
        for (text, end) in [
            (r#"{"a": "}"} x"#, 10),
            (r#"[1, [2], "]"], 3"#, 13),
            (r#""a\"b" x"#, 6),
            ("12.5}", 4),
            ("true ", 4),
        ] {
            let mut scan = ValueScan::default();
            let mut at = None;
            for (i, b) in text.bytes().enumerate() {
                match scan.feed(b) {
                    Scan::More => {}
                    Scan::EndWith => {
                        at = Some(i + 1);
                        break;
                    }
                    Scan::EndBefore => {
                        at = Some(i);
                        break;
                    }
                }
            }
            assert_eq!(at, Some(end), "{text}");
        }
    }

    #[test]
    fn llama3_calls_are_the_whole_answer_or_not_at_all() {
        let mut o = Output::new(Vec::new(), Some(CallFormat::Llama3));
        let v = feed(
            &mut o,
            &[" ", "\n{\"name\": \"f\", ", "\"parameters\": {\"x\": [1]}}"],
        );
        assert_eq!(
            streamed_calls(&v),
            vec![("f".into(), "{\"x\": [1]}".into())]
        );
        assert_eq!(text_of(&v), "");
        let mut o = Output::new(Vec::new(), Some(CallFormat::Llama3));
        let v = feed(&mut o, &["It is ", "{\"name\": \"f\"}"]);
        assert_eq!(text_of(&v), "It is {\"name\": \"f\"}");
        assert!(o.calls.is_empty());
    }

    #[test]
    fn mistral_calls_follow_text_and_each_other() {
        let mut o = Output::new(Vec::new(), Some(CallFormat::MistralArgs));
        let text = "Checking.[TOOL_CALLS]f[ARGS]{\"a\": \"[ARGS]\"}[TOOL_CALLS]g-1[ARGS]{}";
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
        let v = feed(&mut o, &parts);
        assert_eq!(text_of(&v), "Checking.");
        assert_eq!(
            streamed_calls(&v),
            vec![
                ("f".into(), "{\"a\": \"[ARGS]\"}".into()),
                ("g-1".into(), "{}".into())
            ]
        );
        assert_eq!(o.calls.len(), 2);
        let mut o = Output::new(Vec::new(), Some(CallFormat::MistralList));
        let v = feed(
            &mut o,
            &[
                "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcdefghi\"}]",
                "</s>",
            ],
        );
        assert_eq!(streamed_calls(&v), vec![("f".into(), "{}".into())]);
        assert_eq!(o.calls.len(), 1);
        assert!(!o.cut_call);
    }

    #[test]
    fn a_repeated_call_ends_the_answer_unseen() {
        // Hermes calls: the second differs (kept), the third repeats the first with its keys in
        // another order (dropped, and nothing after it is read).
        let mut o = Output::new(Vec::new(), Some(CallFormat::Hermes));
        let call = |args: &str| {
            format!("<tool_call>\n{{\"name\": \"f\", \"arguments\": {args}}}\n</tool_call>\n")
        };
        let text = format!(
            "{}{}{}{}",
            call(r#"{"a": 1, "b": [2]}"#),
            call(r#"{"a": 2}"#),
            call(r#"{"b": [2], "a": 1}"#),
            call(r#"{"a": 3}"#)
        );
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
        let v = feed(&mut o, &parts);
        assert_eq!(
            streamed_calls(&v),
            vec![
                ("f".into(), r#"{"a": 1, "b": [2]}"#.into()),
                ("f".into(), r#"{"a": 2}"#.into())
            ]
        );
        assert!(o.repeated_call && o.stopped && !o.cut_call);
        assert_eq!(o.calls.len(), 2);
        // Nothing of the repeated call was given out, not even its start.
        assert!(
            !v.iter()
                .any(|p| matches!(p, Piece::CallStart(2, _) | Piece::CallArgs(2, _)))
        );
    }
}

mod harmony {
    use super::super::*;

    fn read(o: &mut Output, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4];
        for c in text.chars() {
            out.extend(o.push(c.encode_utf8(&mut buf), None));
        }
        out.extend(o.finish(""));
        out
    }

    #[test]
    fn harmony_answers_split_into_reasoning_and_content_with_stops() {
        let mut o = Output::new(vec![" nice".into()], None).with_channels();
        read(
            &mut o,
            "<|channel|>analysis<|message|>Think <b>.<|end|><|start|>assistant<|channel|>final<|message|>Paris is nice.",
        );
        assert_eq!(o.reasoning, "Think <b>.");
        assert_eq!(o.content, "Paris is");
        assert!(o.stopped && o.calls.is_empty());
    }

    #[test]
    fn a_harmony_call_streams_and_a_cut_one_is_marked() {
        let head = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
        let mut o = Output::new(Vec::new(), Some(CallFormat::Harmony)).with_channels();
        let pieces = read(&mut o, &format!("{head}{{\"city\": \"Oslo\"}}"));
        assert_eq!(o.reasoning, "Need weather.");
        assert_eq!(o.content, "");
        assert!(!o.cut_call);
        let args: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::CallArgs(0, t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(args, "{\"city\": \"Oslo\"}");
        assert!(pieces.contains(&Piece::CallStart(0, "get_weather".into())));
        assert_eq!(o.calls.len(), 1);
        assert_eq!(o.calls[0].arguments, "{\"city\": \"Oslo\"}");

        let mut o = Output::new(Vec::new(), Some(CallFormat::Harmony)).with_channels();
        read(&mut o, &format!("{head}{{\"city\": \"Os"));
        assert!(o.cut_call && o.calls.is_empty());
        // With tools off, a call message is only text of the answer.
        let mut o = Output::new(Vec::new(), None).with_channels();
        read(&mut o, &format!("{head}{{}}"));
        assert!(o.calls.is_empty() && o.content == "{}");
    }
}
