//! The exports the JavaScript loader calls. Plain `extern "C"` functions over numbers and
//! pointers into this module's memory; no wasm-bindgen.
//!
//! - `spk_input(len) -> ptr`: room for a request of `len` bytes (UTF-8 JSON
//!   `{"op": ..., ...}`); the host writes it there, then calls `spk_call(len) -> status`
//!   (0 ok, 1 error). The reply (JSON: the result, or `{"error", "kind", "fields"}`) is at
//!   `spk_output_ptr()`, `spk_output_len()` bytes, until the next call.
//! - Buffers for large inputs and outputs: `spk_buffer_new(len) -> handle` (0 when memory is
//!   refused), `spk_buffer_ptr(handle)`, `spk_buffer_len(handle)`, `spk_buffer_free(handle)`.
//!   The host streams weights straight into a buffer (no second copy) and names the handle in
//!   a request; replies that carry bytes (a session file) name a new buffer.
//!
//! Memory may grow during any call: the host takes fresh views of `memory.buffer` after each.
//! Pointers above 2 GiB are negative as i32 in JS (`p >>> 0`).

use std::cell::RefCell;

use serde_json::{json, Value};

use crate::engine::{Buffers, CallError, Engine, Memory};
use crate::host::install;

#[derive(Default)]
struct State {
    input: Vec<u8>,
    output: Vec<u8>,
    buffers: Buffers,
    engine: Engine,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

#[no_mangle]
pub extern "C" fn spk_input(len: usize) -> *mut u8 {
    install();
    with_state(|s| {
        s.input.clear();
        s.input.resize(len, 0);
        s.input.as_mut_ptr()
    })
}

#[no_mangle]
pub extern "C" fn spk_call(len: usize) -> u32 {
    install();
    with_state(|s| {
        let before = Memory::pages_now();
        let decoding = s.engine.decoding();
        let result = match serde_json::from_slice::<Value>(&s.input[..len.min(s.input.len())]) {
            Err(e) => Err(CallError {
                message: format!("request is not JSON: {e}"),
                kind: "InvalidInputError",
                fields: Vec::new(),
            }),
            Ok(request) => match request.get("op").and_then(|o| o.as_str()) {
                None => Err(CallError {
                    message: "request without an op".into(),
                    kind: "InvalidInputError",
                    fields: Vec::new(),
                }),
                Some(op) => {
                    let op = op.to_string();
                    s.engine.call(&op, &request, &mut s.buffers)
                }
            },
        };
        let (status, reply) = match result {
            Ok(value) => (0, value),
            Err(e) => (
                1,
                json!({"error": e.message, "kind": e.kind, "fields": e.fields}),
            ),
        };
        s.output.clear();
        // Serializing a Value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut s.output, &reply);
        let after = Memory::pages_now();
        s.engine.memory.note(before, after, decoding);
        status
    })
}

#[no_mangle]
pub extern "C" fn spk_output_ptr() -> *const u8 {
    with_state(|s| s.output.as_ptr())
}

#[no_mangle]
pub extern "C" fn spk_output_len() -> usize {
    with_state(|s| s.output.len())
}

#[no_mangle]
pub extern "C" fn spk_buffer_new(len: usize) -> u32 {
    install();
    with_state(|s| {
        let before = Memory::pages_now();
        let handle = match s.buffers.create(len) {
            Ok(h) => h,
            Err(e) => {
                s.output.clear();
                let _ = serde_json::to_writer(
                    &mut s.output,
                    &json!({"error": e.message, "kind": e.kind, "fields": []}),
                );
                0
            }
        };
        s.engine.memory.note(before, Memory::pages_now(), false);
        handle
    })
}

#[no_mangle]
pub extern "C" fn spk_buffer_ptr(handle: u32) -> *mut u8 {
    with_state(|s| {
        s.buffers
            .get_mut(handle)
            .map_or(std::ptr::null_mut(), |b| b.as_mut_bytes().as_mut_ptr())
    })
}

#[no_mangle]
pub extern "C" fn spk_buffer_len(handle: u32) -> usize {
    with_state(|s| s.buffers.get_mut(handle).map_or(0, |b| b.len()))
}

#[no_mangle]
pub extern "C" fn spk_buffer_free(handle: u32) {
    with_state(|s| {
        s.buffers.remove(handle);
    })
}
