//! Cache options as every front end takes them (the Python `kv=` dict, the CLI's
//! `turbo:window=0` arms, the browser's JSON): a preset name plus optional overrides, under the
//! keys of [`OPTION_KEYS`]. The keys, their value types, the default preset and the merge rule
//! (preset first, then each override, then the model's context as the capacity) are defined here
//! once; front ends only convert their values to [`OptionValue`].

use crate::config::{
    KvCodecKind, KvConfig, NormFormat, DEFAULT_MAX_TOKENS, DEFAULT_PRESET, PRESETS,
};
use crate::error::KvError;

/// Every option key, in the order they are resolved and reported.
pub const OPTION_KEYS: [&str; 11] = [
    "preset",
    "k_bits",
    "v_bits",
    "window",
    "page_tokens",
    "sink_tokens",
    "max_context",
    "key_norm",
    "kivi_group",
    "seed",
    "sparse_v",
];

/// Short names accepted in a spec string (`turbo:k=3:w=64`), each for one key.
const SPEC_ALIASES: [(&str, &str); 6] = [
    ("k", "k_bits"),
    ("v", "v_bits"),
    ("w", "window"),
    ("page", "page_tokens"),
    ("sink", "sink_tokens"),
    ("sinks", "sink_tokens"),
];

/// The type of value a key takes; a front end converts its own values to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionKind {
    /// `preset`, `key_norm`.
    Text,
    /// `k_bits`, `v_bits`: bits per channel.
    Bits,
    /// Token counts; negative values are refused here, so front ends pass them as they came.
    Count,
    /// `seed`.
    Seed,
    /// `sparse_v`: a fraction.
    Fraction,
}

#[derive(Clone, Debug, PartialEq)]
pub enum OptionValue {
    Text(String),
    Bits(f32),
    Count(i64),
    Seed(u64),
    Fraction(f32),
}

/// A preset name and the overrides given; `None` means "not given" (the preset decides).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvOptions {
    pub preset: Option<String>,
    pub k_bits: Option<f32>,
    pub v_bits: Option<f32>,
    pub window: Option<usize>,
    pub page_tokens: Option<usize>,
    pub sink_tokens: Option<usize>,
    /// Capacity in tokens; at most the model's context.
    pub max_context: Option<usize>,
    pub key_norm: Option<NormFormat>,
    pub kivi_group: Option<usize>,
    pub seed: Option<u64>,
    pub sparse_v: Option<f32>,
}

/// What a model family changes in the presets' defaults, from measurements on it (README,
/// "Gemma 3 270M"): filled in where the options leave a value to the preset, so anything
/// the user sets still wins and the identity record holds what was used.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ModelKvDefaults {
    /// Key bits of the `turbo` codec when `k_bits` is not given.
    pub turbo_k_bits: Option<f32>,
    /// Value bits of the `turbo` codec when `v_bits` is not given.
    pub turbo_v_bits: Option<f32>,
}

fn invalid(message: String) -> KvError {
    KvError::InvalidOption(message)
}

impl KvOptions {
    /// The value type of `key`; an unknown key is an error, so that a typo never silently
    /// falls back to a default.
    pub fn kind_of(key: &str) -> Result<OptionKind, KvError> {
        Ok(match key {
            "preset" | "key_norm" => OptionKind::Text,
            "k_bits" | "v_bits" => OptionKind::Bits,
            "window" | "page_tokens" | "sink_tokens" | "max_context" | "kivi_group" => {
                OptionKind::Count
            }
            "seed" => OptionKind::Seed,
            "sparse_v" => OptionKind::Fraction,
            other => {
                return Err(invalid(format!(
                    "unknown KV option {other:?} (expected one of {})",
                    OPTION_KEYS.join(", ")
                )))
            }
        })
    }

    /// Sets `key` (one of [`OPTION_KEYS`]) to `value`, which must be of the key's kind.
    pub fn set(&mut self, key: &str, value: OptionValue) -> Result<(), KvError> {
        let kind = Self::kind_of(key)?;
        let wrong = || invalid(format!("{key} cannot be {value:?}"));
        match (key, value.clone()) {
            ("preset", OptionValue::Text(name)) => self.preset = Some(name),
            ("key_norm", OptionValue::Text(name)) => {
                self.key_norm = Some(NormFormat::from_name(&name)?)
            }
            ("k_bits", OptionValue::Bits(bits)) => self.k_bits = Some(bits),
            ("v_bits", OptionValue::Bits(bits)) => self.v_bits = Some(bits),
            ("seed", OptionValue::Seed(seed)) => self.seed = Some(seed),
            ("sparse_v", OptionValue::Fraction(f)) => self.sparse_v = Some(f),
            (_, OptionValue::Count(n)) if kind == OptionKind::Count => {
                let n = usize::try_from(n)
                    .map_err(|_| invalid(format!("{key} must be >= 0, got {n}")))?;
                let slot = match key {
                    "window" => &mut self.window,
                    "page_tokens" => &mut self.page_tokens,
                    "sink_tokens" => &mut self.sink_tokens,
                    "max_context" => &mut self.max_context,
                    _ => &mut self.kivi_group,
                };
                *slot = Some(n);
            }
            _ => return Err(wrong()),
        }
        Ok(())
    }

    /// The value given for `key`, if any (`None` for unknown keys too).
    pub fn get(&self, key: &str) -> Option<OptionValue> {
        let count = |n: Option<usize>| n.map(|n| OptionValue::Count(n as i64));
        match key {
            "preset" => self.preset.clone().map(OptionValue::Text),
            "k_bits" => self.k_bits.map(OptionValue::Bits),
            "v_bits" => self.v_bits.map(OptionValue::Bits),
            "window" => count(self.window),
            "page_tokens" => count(self.page_tokens),
            "sink_tokens" => count(self.sink_tokens),
            "max_context" => count(self.max_context),
            "key_norm" => self
                .key_norm
                .map(|n| OptionValue::Text(n.name().to_string())),
            "kivi_group" => count(self.kivi_group),
            "seed" => self.seed.map(OptionValue::Seed),
            "sparse_v" => self.sparse_v.map(OptionValue::Fraction),
            _ => None,
        }
    }

    /// The preset these options start from: the one named, else [`DEFAULT_PRESET`].
    pub fn preset_name(&self) -> &str {
        self.preset.as_deref().unwrap_or(DEFAULT_PRESET)
    }

    /// Options from a spec string `preset[:key=value...]` (`turbo:window=0:k=3`), as the CLI
    /// names cache arms. Keys may use the short names `k`, `v`, `w`, `page`, `sink(s)`;
    /// `max_context` is not accepted (it is the model's business). Returns the options and the
    /// keys in the order written, so a label can repeat them.
    pub fn parse_spec(spec: &str) -> Result<(KvOptions, Vec<&'static str>), KvError> {
        let spec = spec.trim();
        let mut parts = spec.split(':');
        let preset = parts.next().unwrap_or_default().trim();
        if !PRESETS.contains(&preset) {
            return Err(KvError::UnknownPreset(preset.to_string()));
        }
        let mut options = KvOptions {
            preset: Some(preset.to_string()),
            ..KvOptions::default()
        };
        let settable: Vec<&str> = OPTION_KEYS
            .into_iter()
            .filter(|k| !matches!(*k, "preset" | "max_context"))
            .collect();
        let mut order = Vec::new();
        for setting in parts {
            let (key, value) = setting.split_once('=').unwrap_or((setting, ""));
            let key = key.trim();
            let key = SPEC_ALIASES
                .iter()
                .find(|(alias, _)| *alias == key)
                .map_or(key, |(_, full)| full);
            let Some(key) = settable.iter().copied().find(|k| *k == key) else {
                return Err(invalid(format!(
                    "bad KV setting {setting:?} in {spec:?}: use key=value with key one of {}",
                    settable.join(", ")
                )));
            };
            let value = value.trim();
            let bad_value = || invalid(format!("bad value for {key} in {spec:?}: {value:?}"));
            let parsed = match Self::kind_of(key)? {
                OptionKind::Text => OptionValue::Text(value.to_string()),
                OptionKind::Bits => OptionValue::Bits(value.parse().map_err(|_| bad_value())?),
                OptionKind::Count => OptionValue::Count(value.parse().map_err(|_| bad_value())?),
                OptionKind::Seed => OptionValue::Seed(value.parse().map_err(|_| bad_value())?),
                OptionKind::Fraction => {
                    OptionValue::Fraction(value.parse().map_err(|_| bad_value())?)
                }
            };
            if order.contains(&key) {
                return Err(invalid(format!("{key} is given twice in {spec:?}")));
            }
            options.set(key, parsed)?;
            order.push(key);
        }
        Ok((options, order))
    }
}

impl KvOptions {
    /// These options with a model family's `defaults` where they leave a value to the preset.
    pub fn with_model_defaults(&self, defaults: ModelKvDefaults) -> Result<KvOptions, KvError> {
        let mut out = self.clone();
        if KvConfig::preset(self.preset_name())?.codec == KvCodecKind::Turbo {
            out.k_bits = out.k_bits.or(defaults.turbo_k_bits);
            out.v_bits = out.v_bits.or(defaults.turbo_v_bits);
        }
        Ok(out)
    }
}

impl KvConfig {
    /// The cache policy for `options` on a model whose context is `context` tokens and whose
    /// family changes the presets' defaults by `defaults`.
    pub fn for_model(
        options: &KvOptions,
        context: usize,
        defaults: ModelKvDefaults,
    ) -> Result<KvConfig, KvError> {
        KvConfig::from_options(&options.with_model_defaults(defaults)?, Some(context))
    }

    /// The cache policy for `options` on a model whose context is `context` tokens (`None`
    /// when no model is known yet: the capacity is then `max_context` or the preset's).
    /// Checked without a shape (`validate_policy`); `KvCache::new` checks the rest.
    pub fn from_options(options: &KvOptions, context: Option<usize>) -> Result<KvConfig, KvError> {
        let mut config = KvConfig::preset(options.preset_name())?;
        config.max_tokens = context.unwrap_or(DEFAULT_MAX_TOKENS);
        // The fp16 cache stores every key and value as it is: bits would be ignored.
        for (key, bits) in [("k_bits", options.k_bits), ("v_bits", options.v_bits)] {
            if config.codec == KvCodecKind::Fp16 && bits.is_some() {
                return Err(invalid(format!(
                    "{key} does not apply to the fp16 preset (it keeps keys and values in fp16)"
                )));
            }
        }
        if let Some(bits) = options.k_bits {
            config.k_bits = bits;
        }
        if let Some(bits) = options.v_bits {
            config.v_bits = bits;
        }
        for (slot, value) in [
            (&mut config.window, options.window),
            (&mut config.page_tokens, options.page_tokens),
            (&mut config.sink_tokens, options.sink_tokens),
            (&mut config.kivi_group, options.kivi_group),
        ] {
            if let Some(value) = value {
                *slot = value;
            }
        }
        if let Some(seed) = options.seed {
            config.seed = seed;
        }
        if let Some(threshold) = options.sparse_v {
            config.sparse_v = threshold;
        }
        if let Some(wanted) = options.max_context {
            match context {
                Some(context) if wanted == 0 || wanted > context => {
                    return Err(invalid(format!(
                        "max_context {wanted} must be in 1..={context} (the model's context length)"
                    )))
                }
                None if wanted == 0 => {
                    return Err(invalid("max_context 0 must be at least 1".to_string()))
                }
                _ => config.max_tokens = wanted,
            }
        }
        if let Some(norm) = options.key_norm {
            config.key_norm = norm;
        }
        config.validate_policy()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KvCodecKind;

    #[test]
    fn no_options_means_the_default_preset_at_the_models_context() {
        let config = KvConfig::from_options(&KvOptions::default(), Some(4096)).unwrap();
        assert_eq!(
            config,
            KvConfig {
                max_tokens: 4096,
                ..KvConfig::default()
            }
        );
        assert_eq!(config.codec, KvCodecKind::Turbo);
        assert_eq!(
            KvConfig::default(),
            KvConfig::preset(DEFAULT_PRESET).unwrap()
        );
    }

    #[test]
    fn a_model_family_changes_only_what_the_options_leave_to_a_turbo_preset() {
        let gemma = ModelKvDefaults {
            turbo_k_bits: Some(4.0),
            turbo_v_bits: None,
        };
        let bits = |spec: &str| {
            let (options, _) = KvOptions::parse_spec(spec).unwrap();
            let config = KvConfig::for_model(&options, 4096, gemma).unwrap();
            (config.k_bits, config.v_bits)
        };
        let turbo = KvConfig::turbo();
        assert_eq!(bits("turbo"), (4.0, turbo.v_bits));
        assert_eq!(bits("turbo:k=3"), (3.0, turbo.v_bits));
        assert_eq!(bits("kivi2"), (2.0, 2.0));
        assert_eq!(bits("turbo-qjl"), {
            let qjl = KvConfig::turbo_qjl();
            (qjl.k_bits, qjl.v_bits)
        });
        let default = KvConfig::for_model(&KvOptions::default(), 4096, gemma).unwrap();
        assert_eq!(default.k_bits, 4.0, "the default preset is turbo");
        let plain = KvConfig::for_model(&KvOptions::default(), 4096, ModelKvDefaults::default());
        assert_eq!(
            plain.unwrap(),
            KvConfig::from_options(&KvOptions::default(), Some(4096)).unwrap()
        );
    }

    #[test]
    fn overrides_apply_over_the_named_preset() {
        let mut options = KvOptions::default();
        for (key, value) in [
            ("preset", OptionValue::Text("kivi4".into())),
            ("window", OptionValue::Count(0)),
            ("kivi_group", OptionValue::Count(8)),
            ("max_context", OptionValue::Count(100)),
            ("key_norm", OptionValue::Text("log-u8".into())),
            ("seed", OptionValue::Seed(5)),
        ] {
            options.set(key, value).unwrap();
        }
        let config = KvConfig::from_options(&options, Some(2048)).unwrap();
        assert_eq!(config.codec, KvCodecKind::Kivi);
        assert_eq!((config.k_bits, config.v_bits), (4.0, 4.0));
        assert_eq!((config.window, config.kivi_group), (0, 8));
        assert_eq!((config.max_tokens, config.seed), (100, 5));
    }

    #[test]
    fn bad_options_are_refused_with_the_key_named() {
        let mut options = KvOptions::default();
        let message = |e: KvError| e.to_string();
        assert!(
            message(options.set("windw", OptionValue::Count(1)).unwrap_err())
                .starts_with("unknown KV option \"windw\" (expected one of preset, k_bits")
        );
        assert_eq!(
            message(options.set("window", OptionValue::Count(-1)).unwrap_err()),
            "window must be >= 0, got -1"
        );
        assert!(options.set("window", OptionValue::Bits(1.0)).is_err());
        assert_eq!(
            message(
                options
                    .set("key_norm", OptionValue::Text("f32".into()))
                    .unwrap_err()
            ),
            "key_norm \"f32\" must be \"u8\" or \"f16\""
        );
        options.max_context = Some(10_000);
        assert_eq!(
            message(KvConfig::from_options(&options, Some(2048)).unwrap_err()),
            "max_context 10000 must be in 1..=2048 (the model's context length)"
        );
        let bits = KvOptions {
            k_bits: Some(5.0),
            ..KvOptions::default()
        };
        assert!(matches!(
            KvConfig::from_options(&bits, None),
            Err(KvError::InvalidConfig(m)) if m.contains("k_bits = 5")
        ));
        let preset = KvOptions {
            preset: Some("turbo3".into()),
            ..KvOptions::default()
        };
        assert!(matches!(
            KvConfig::from_options(&preset, None),
            Err(KvError::UnknownPreset(_))
        ));
    }

    #[test]
    fn sparse_values_are_the_turbo_presets_and_a_fraction_below_one() {
        let threshold = |spec: &str| {
            let (options, _) = KvOptions::parse_spec(spec)?;
            KvConfig::from_options(&options, Some(2048)).map(|c| c.sparse_v)
        };
        assert_eq!(threshold("turbo").unwrap(), crate::config::TURBO_SPARSE_V);
        assert_eq!(threshold("turbo:sparse_v=0").unwrap(), 0.0);
        assert_eq!(threshold("kivi4:sparse_v=0.001").unwrap(), 0.001);
        for control in ["fp16", "turbo-qjl", "kivi2", "kivi4"] {
            assert_eq!(threshold(control).unwrap(), 0.0, "{control}");
        }
        for bad in [
            "turbo:sparse_v=1",
            "turbo:sparse_v=-0.1",
            "turbo:sparse_v=NaN",
        ] {
            let message = threshold(bad).unwrap_err().to_string();
            assert!(
                message.contains("sparse_v") && message.contains("[0, 1)"),
                "{message}"
            );
        }
    }

    #[test]
    fn spec_strings_take_short_names_and_keep_their_order() {
        let (options, order) = KvOptions::parse_spec("turbo:w=0:k=3:sinks=4").unwrap();
        assert_eq!(order, ["window", "k_bits", "sink_tokens"]);
        assert_eq!(options.get("window"), Some(OptionValue::Count(0)));
        assert_eq!(options.get("seed"), None);
        assert_eq!(options.preset.as_deref(), Some("turbo"));
        assert_eq!(
            (options.window, options.k_bits, options.sink_tokens),
            (Some(0), Some(3.0), Some(4))
        );
        let (sparse, _) = KvOptions::parse_spec("turbo:sparse_v=0").unwrap();
        assert_eq!(sparse.get("sparse_v"), Some(OptionValue::Fraction(0.0)));
        assert!(KvOptions::parse_spec("turbo:sparse_v=").is_err());
        assert!(KvOptions::parse_spec("turbo:max_context=5").is_err());
        assert!(KvOptions::parse_spec("turbo:window").is_err());
        assert!(KvOptions::parse_spec("turbo:k=x").is_err());
        assert!(matches!(
            KvOptions::parse_spec("nope"),
            Err(KvError::UnknownPreset(_))
        ));
        // A key given twice (`w` and `window` are one key) is refused, not overridden.
        let twice = KvOptions::parse_spec("turbo:window=1:w=2").unwrap_err();
        assert!(
            twice.to_string().contains("window is given twice"),
            "{twice}"
        );
    }

    #[test]
    fn bits_of_the_fp16_preset_are_refused_not_ignored() {
        for spec in ["fp16:k=3", "fp16:v_bits=2"] {
            let (options, _) = KvOptions::parse_spec(spec).unwrap();
            let err = KvConfig::from_options(&options, Some(512)).unwrap_err();
            assert!(
                err.to_string().contains("does not apply to the fp16"),
                "{err}"
            );
        }
        let (window, _) = KvOptions::parse_spec("fp16:window=64").unwrap();
        assert!(KvConfig::from_options(&window, Some(512)).is_ok());
    }
}
