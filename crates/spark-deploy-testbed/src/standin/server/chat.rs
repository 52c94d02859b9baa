//! Running a chat completion: the round trip to rank 1, timing, JSON replies and SSE streams,
//! usage and the prompt cache.

use super::*;

pub(super) fn usage(p: &ChatPlan, cached: u64) -> Value {
    json!({
        "prompt_tokens": p.prompt_tokens,
        "completion_tokens": p.completion_tokens,
        "total_tokens": p.prompt_tokens + p.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": p.reasoning_tokens},
    })
}

pub(super) fn sse_line(e: &Value) -> String {
    format!("data: {e}\n\n")
}

pub(super) fn sse(events: &[Value]) -> Response {
    let mut text: String = events.iter().map(sse_line).collect();
    text.push_str("data: [DONE]\n\n");
    sse_response(Body::from(text))
}

pub(super) fn sse_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// What every chunk and reply of one request shares.
pub(super) struct Reply {
    id: String,
    created: u64,
    proof: Value,
    cached: u64,
}

impl Reply {
    fn chunk(&self, plan: &ChatPlan, delta: Value, finish: Value) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": plan.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
               "split_proof": self.proof})
    }

    fn call_id(&self, plan: &ChatPlan) -> String {
        let (name, args) = plan.tool_call.clone().unwrap_or_default();
        format!(
            "call_{}",
            &hex::encode(Sha256::digest(format!("{name}{args}{}", self.id)))[..24]
        )
    }

    /// The delta of one verify step's tokens.
    fn delta(&self, plan: &ChatPlan, step: &[Piece]) -> Value {
        let mut d = serde_json::Map::new();
        let mut join = |key: &str, s: &str| {
            let prev = d.get(key).and_then(Value::as_str).unwrap_or_default();
            let joined = format!("{prev}{s}");
            d.insert(key.to_owned(), json!(joined));
        };
        let mut head = false;
        let mut args = String::new();
        for p in step {
            match p {
                Piece::Reasoning(s) => join("reasoning_content", s),
                Piece::Content(s) => join("content", s),
                Piece::ToolName(_) => head = true,
                Piece::ToolArgs(s) => args.push_str(s),
            }
        }
        if head || !args.is_empty() {
            let mut call = json!({"index": 0, "function": {"arguments": args}});
            if head {
                let name = plan.tool_call.as_ref().map(|t| t.0.clone());
                call["id"] = json!(self.call_id(plan));
                call["type"] = json!("function");
                call["function"]["name"] = json!(name);
            }
            d.insert("tool_calls".into(), json!([call]));
        }
        Value::Object(d)
    }

    fn extras(&self, plan: &ChatPlan, t: &generate::Timing) -> Value {
        json!({
            "engine": "tensorfold-native stand-in",
            "rank1": "followed",
            "images": plan.images.iter().map(|i| json!({"bytes": i.bytes, "width": i.width, "height": i.height, "format": "png"})).collect::<Vec<_>>(),
            "thinking": plan.thinking,
            "prefill_s": (t.prefill_s * 1e6).round() / 1e6,
            "token_sha": generate::token_sha(&plan.pieces),
            "draft": plan.draft,
            "kind": plan.kind.name(),
        })
    }
}

pub(super) async fn chat(
    st: &Arc<AppState>,
    running: Running,
    body: &[u8],
    arrived: tokio::time::Instant,
) -> Response {
    st.requests.fetch_add(1, Ordering::SeqCst);
    if st.wedged().is_some() {
        // A wedged pair: the request runs forever (until the client gives up).
        let _running = running;
        return std::future::pending().await;
    }
    let fail = |e: ApiError| {
        st.failures.fetch_add(1, Ordering::SeqCst);
        e.response()
    };
    let plan = match plan_chat(&st.cfg, body) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    if let Some(msg) = st.cfg.proof.failure() {
        return fail(ApiError {
            status: 500,
            kind: "server_error",
            code: "split_proof_failed",
            message: msg,
        });
    }
    let mut fields = Vec::with_capacity(12);
    fields.extend_from_slice(&(plan.prompt_tokens as u32).to_le_bytes());
    fields.extend_from_slice(&(plan.max_tokens as u32).to_le_bytes());
    fields.extend_from_slice(&(plan.images.len() as u32).to_le_bytes());
    let k = if plan.images.is_empty() {
        kind::PASS
    } else {
        kind::FILL_IMAGES
    };
    if let Err(e) = st.round_trip(k, &fields).await {
        st.failures.fetch_add(1, Ordering::SeqCst);
        let err = ApiError {
            status: 500,
            kind: "server_error",
            code: e.name(),
            message: format!(
                "{}: the link to rank 1 failed; every stream ends with this error until both ranks are restarted",
                e.name()
            ),
        };
        if plan.stream {
            return sse(&[err.body()]);
        }
        return err.response();
    }
    let cached = plan.cache_key.map_or(0, |key| {
        let mut c = st
            .prompt_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if c.insert(key) {
            0
        } else {
            plan.prompt_tokens.saturating_sub(1)
        }
    });
    st.prompt_tokens
        .fetch_add(plan.prompt_tokens, Ordering::SeqCst);
    let reply = Reply {
        id: format!("chatcmpl-{}", &hex::encode(Sha256::digest(body))[..24]),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        proof: st.cfg.proof.to_json(),
        cached,
    };
    if plan.stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let st = st.clone();
        tokio::spawn(async move {
            let _running = running;
            let send = |v: &Value| tx.send(sse_line(v)).is_ok();
            if !send(&reply.chunk(
                &plan,
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            )) {
                return;
            }
            let timing = generate::run(run_of(&st, &plan, cached, arrived), &plan.pieces, |step| {
                st.generated.fetch_add(step.len() as u64, Ordering::SeqCst);
                send(&reply.chunk(&plan, reply.delta(&plan, step), Value::Null))
            })
            .await;
            let Some(t) = timing else { return };
            if st.wedged().is_some() {
                // The pair wedged while this request ran: it never finishes (and keeps counting
                // as running), like every request after the onset.
                std::future::pending::<()>().await;
            }
            count_drafts(&st, &t);
            let mut last = reply.chunk(&plan, json!({}), json!(plan.finish_reason));
            last["tensorfold"] = reply.extras(&plan, &t);
            last["speculative"] = json!({"drafted": t.drafted, "accepted": t.accepted});
            send(&last);
            if plan.include_usage {
                send(
                    &json!({"id": reply.id, "object": "chat.completion.chunk", "created": reply.created,
                             "model": plan.model, "choices": [], "usage": usage(&plan, reply.cached),
                             "split_proof": reply.proof}),
                );
            }
            let _ = tx.send("data: [DONE]\n\n".to_owned());
        });
        let body = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|s| (Ok::<_, std::convert::Infallible>(bytes::Bytes::from(s)), rx))
        });
        return sse_response(Body::from_stream(body));
    }
    let Some(t) = generate::run(run_of(st, &plan, cached, arrived), &plan.pieces, |step| {
        st.generated.fetch_add(step.len() as u64, Ordering::SeqCst);
        true
    })
    .await
    else {
        return fail(ApiError {
            status: 500,
            kind: "server_error",
            code: "generation_stopped",
            message: "the generation stopped".into(),
        });
    };
    if st.wedged().is_some() {
        // The pair wedged while this request ran: it never answers.
        let _running = running;
        return std::future::pending().await;
    }
    drop(running);
    count_drafts(st, &t);
    let mut message = json!({"role": "assistant", "content": plan.content()});
    if let Some(r) = plan.reasoning() {
        message["reasoning_content"] = json!(r);
    }
    if let Some((name, args)) = &plan.tool_call {
        message["tool_calls"] = json!([{"id": reply.call_id(&plan), "type": "function",
                                         "function": {"name": name, "arguments": args}}]);
    }
    json_response(
        StatusCode::OK,
        &json!({
            "id": reply.id,
            "object": "chat.completion",
            "created": reply.created,
            "model": plan.model,
            "choices": [{"index": 0, "message": message, "finish_reason": plan.finish_reason, "logprobs": null}],
            "usage": usage(&plan, reply.cached),
            "exact_mode": true,
            "tensorfold": reply.extras(&plan, &t),
            "speculative": {"drafted": t.drafted, "accepted": t.accepted},
            "split_proof": reply.proof,
        }),
    )
}

pub(super) fn run_of<'a>(
    st: &'a AppState,
    plan: &ChatPlan,
    cached: u64,
    arrived: tokio::time::Instant,
) -> Run<'a> {
    Run {
        perf: &st.cfg.perf,
        decoding: &st.decoding,
        uncached: plan.prompt_tokens - cached,
        kind: plan.kind,
        draft: plan.draft,
        arrived,
    }
}

pub(super) fn count_drafts(st: &AppState, t: &generate::Timing) {
    st.drafted.fetch_add(t.drafted, Ordering::SeqCst);
    st.accepted.fetch_add(t.accepted, Ordering::SeqCst);
}
