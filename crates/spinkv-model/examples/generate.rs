//! Greedy continuation of a token-id prompt (debugging aid; the CLI does real chat).
//!
//! cargo run --release -p spinkv-model --example generate -- MODEL_DIR 1,2,3 [max_new=32]

use spinkv_model::{KvConfig, Model, Sampler, SamplerParams, Session};
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: generate MODEL_DIR TOKEN_IDS [max_new]");
        std::process::exit(2);
    }
    let run = || -> Result<Vec<u32>, spinkv_model::ModelError> {
        let model = Model::load(&PathBuf::from(&args[1]))?;
        let prompt: Vec<u32> = args[2]
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        let max_new: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(32);
        let eos = model.config().eos_token_ids.clone();
        let mut session = Session::new(model, KvConfig::default())?;
        let mut sampler = Sampler::new(SamplerParams::default())?;
        session.prefill(&prompt, false)?;
        let mut out = Vec::new();
        for _ in 0..max_new {
            let next = session.sample(&mut sampler)?;
            out.push(next);
            if eos.contains(&next) {
                break;
            }
            session.decode(next)?;
        }
        Ok(out)
    };
    match run() {
        Ok(tokens) => println!(
            "{}",
            tokens
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
