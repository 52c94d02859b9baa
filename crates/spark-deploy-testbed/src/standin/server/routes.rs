//! The routes: dispatch by method and path (with the API key check), `/health`, `/v1/models`,
//! `/metrics`.

use super::*;

pub(super) async fn dispatch(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let arrived = tokio::time::Instant::now();
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if path == "/health" {
        return health(&st);
    }
    let is_metrics = path == "/metrics" || path == "/v1/metrics";
    if !(st.authorized(req.headers()) || (is_metrics && st.cfg.metrics_open)) {
        let mut r = ApiError {
            status: 401,
            kind: "authentication_error",
            code: "invalid_api_key",
            message: "missing or invalid API key: send Authorization: Bearer KEY or x-api-key"
                .into(),
        }
        .response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    match (method, path.as_str()) {
        (Method::GET, p) if p.ends_with("/models") => models(&st),
        (Method::GET, _) if is_metrics => metrics(&st),
        (Method::POST, "/v1/chat/completions") => {
            let Ok(body) = axum::body::to_bytes(req.into_body(), 64 << 20).await else {
                return ApiError::bad("cannot read the request body (64 MiB limit)").response();
            };
            let running = Running::enter(&st);
            chat(&st, running, &body, arrived).await
        }
        (Method::POST, "/tokenize" | "/v1/tokenize") => {
            let Ok(body) = axum::body::to_bytes(req.into_body(), 64 << 20).await else {
                return ApiError::bad("cannot read the request body (64 MiB limit)").response();
            };
            match tokenize(&st.cfg, &body) {
                Ok(v) => json_response(StatusCode::OK, &v),
                Err(e) => e.response(),
            }
        }
        (_, p) => ApiError {
            status: 404,
            kind: "not_found_error",
            code: "not_found",
            message: format!("{p} is not served by the engine stand-in"),
        }
        .response(),
    }
}

pub(super) fn health(st: &AppState) -> Response {
    let proof = st.cfg.proof.to_json();
    let v = if st.cfg.keys.is_empty() {
        json!({
            "status": "ok",
            "model": st.cfg.served_ids[0],
            "model_ids": st.cfg.served_ids,
            "max_batch_size": st.cfg.parallel,
            "warming": false,
            "memory": {"active": 0, "cache": 0, "peak": 0},
            "live": st.running.load(Ordering::SeqCst),
            "split_proof": proof,
        })
    } else {
        json!({"status": "ok", "split_proof": proof})
    };
    json_response(StatusCode::OK, &v)
}

pub(super) fn models(st: &AppState) -> Response {
    let data: Vec<Value> = st
        .cfg
        .served_ids
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tensorfold"}))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

pub(super) fn metrics(st: &AppState) -> Response {
    let running = st.running.load(Ordering::SeqCst);
    let load = |c: &AtomicU64| c.load(Ordering::SeqCst).to_string();
    let frozen = st.wedged();
    let generated = || frozen.map_or_else(|| load(&st.generated), |v| v.to_string());
    let rows: [(&str, &str, String); 15] = [
        (
            "tensorfold:requests_total",
            "counter",
            st.requests.load(Ordering::SeqCst).to_string(),
        ),
        (
            "tensorfold:request_failures_total",
            "counter",
            st.failures.load(Ordering::SeqCst).to_string(),
        ),
        (
            "tensorfold:peer_down",
            "gauge",
            u8::from(st.peer_down.load(Ordering::SeqCst)).to_string(),
        ),
        (
            "tensorfold:split_proof_ok",
            "gauge",
            u8::from(st.cfg.proof.ok).to_string(),
        ),
        (
            "tensorfold:pool_positions",
            "gauge",
            st.cfg.pool.to_string(),
        ),
        (
            "tensorfold:num_requests_running",
            "gauge",
            running.to_string(),
        ),
        ("vllm:num_requests_running", "gauge", running.to_string()),
        ("vllm:kv_cache_usage_perc", "gauge", "0".to_owned()),
        (
            "tensorfold:num_requests_decoding",
            "gauge",
            load(&st.decoding),
        ),
        (
            "tensorfold:prompt_tokens_total",
            "counter",
            load(&st.prompt_tokens),
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            load(&st.prompt_tokens),
        ),
        ("tensorfold:generation_tokens_total", "counter", generated()),
        ("vllm:generation_tokens_total", "counter", generated()),
        (
            "vllm:spec_decode_num_draft_tokens",
            "counter",
            load(&st.drafted),
        ),
        (
            "vllm:spec_decode_num_accepted_tokens",
            "counter",
            load(&st.accepted),
        ),
    ];
    let mut text = String::new();
    for (name, t, v) in rows {
        text.push_str(&format!("# TYPE {name} {t}\n{name} {v}\n"));
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
        .into_response()
}
