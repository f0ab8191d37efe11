//! The model's Jinja2 chat template, rendered the way `spinkv.chat_template` renders it in
//! Python (trim_blocks, lstrip_blocks, loop controls, `raise_exception`, `tojson`, Python
//! string methods), with minijinja. The prompt tokens it produces are checked against the
//! Python side's by tests/test_wasm_runtime.py.

use minijinja::{Environment, Error, ErrorKind, Value};

/// Output bound, as in Python (real templates render a few KiB).
const MAX_CHARS: usize = 16 << 20;

pub(crate) struct Template {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("chat template: {message}"),
    ))
}

impl Template {
    pub(crate) fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Template, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(50_000_000));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| format!("chat template does not compile: {e}"))?;
        Ok(Template {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The prompt text for `messages` (`[{"role", "content"}, ...]`).
    pub(crate) fn render(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let list = messages
            .as_array()
            .ok_or_else(|| "messages must be a list".to_string())?;
        for m in list {
            if !m.get("role").is_some_and(|r| r.is_string()) {
                return Err(format!("chat message without a role: {m}"));
            }
        }
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| format!("chat template: {e}"))?;
        let context = minijinja::context! {
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
        };
        let text = template
            .render(context)
            .map_err(|e| format!("chat template failed: {e}"))?;
        if text.chars().count() > MAX_CHARS {
            return Err(format!(
                "chat template stopped: its output passed {MAX_CHARS} characters"
            ));
        }
        Ok(text)
    }
}
