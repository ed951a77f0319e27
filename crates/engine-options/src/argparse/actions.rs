//! What each argparse action does with its values, including the engines'
//! own action classes that the data files name.

use serde_json::Value;

use crate::data::Argument;

/// The behaviour of an action once its values are converted.
#[derive(Debug, Clone, PartialEq)]
pub enum ActionKind {
    /// `store`: the value (or list of values).
    Store,
    /// `store_const`, `store_true`, `store_false`: a fixed value.
    Const(Value),
    Append,
    AppendConst(Value),
    Extend,
    Count,
    /// `BooleanOptionalAction`: `--x` stores true, `--no-x` false.
    BooleanOptional,
    Help,
    Version,
    /// SGLang's `Deprecated*Action`s: print a warning naming the
    /// replacement, then store `stores` (`None`: the values).
    Deprecated {
        new_flag: Option<String>,
        stores: Option<Value>,
    },
    /// SGLang's `DeprecatedAction`: stops with `error` when it has one,
    /// else warns and leaves the value alone.
    Retired {
        error: Option<String>,
    },
    /// SGLang's `LoRAPathAction`: each value stripped, JSON objects decoded.
    LoraPaths,
    /// vLLM's `LoRAParserAction`: `name=path` items or JSON objects.
    LoraModules,
}

impl ActionKind {
    pub fn of(arg: &Argument) -> Self {
        let constant = || arg.constant.clone().unwrap_or(Value::Null);
        match arg.action.as_str() {
            "store" => ActionKind::Store,
            "store_true" => ActionKind::Const(Value::Bool(true)),
            "store_false" => ActionKind::Const(Value::Bool(false)),
            "store_const" => ActionKind::Const(constant()),
            "append" => ActionKind::Append,
            "append_const" => ActionKind::AppendConst(constant()),
            "extend" => ActionKind::Extend,
            "count" => ActionKind::Count,
            "boolean_optional" => ActionKind::BooleanOptional,
            "help" => ActionKind::Help,
            "version" => ActionKind::Version,
            "DeprecatedStoreTrueAction" => ActionKind::Deprecated {
                new_flag: new_flag(arg),
                stores: Some(Value::Bool(true)),
            },
            "DeprecatedStoreConstAction" => ActionKind::Deprecated {
                new_flag: new_flag(arg),
                stores: Some(
                    arg.action_attrs
                        .get("const_value")
                        .cloned()
                        .unwrap_or(Value::Null),
                ),
            },
            "DeprecatedAliasStoreAction" => ActionKind::Deprecated {
                new_flag: new_flag(arg),
                stores: None,
            },
            "DeprecatedAction" => ActionKind::Retired {
                error: arg
                    .action_attrs
                    .get("error_message")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            },
            "LoRAPathAction" => ActionKind::LoraPaths,
            "LoRAParserAction" => ActionKind::LoraModules,
            // Another engine class: behave as the argparse action it
            // derives from; failing that, store what was given.
            _ => match arg.action_base.as_deref() {
                Some(base) if base != arg.action => ActionKind::of(&Argument {
                    action: base.to_string(),
                    ..arg.clone()
                }),
                _ => ActionKind::Store,
            },
        }
    }

    /// The namespace value after this action ran with `values` given as
    /// `option_string`, and a warning to print, if any; or the message of
    /// the parser error the action raised.
    pub fn apply(
        &self,
        arg: &Argument,
        current: Option<&Value>,
        values: Value,
        option_string: Option<&str>,
    ) -> Result<(Value, Option<String>), String> {
        match self {
            ActionKind::LoraModules => return lora_modules(values).map(|v| (v, None)),
            ActionKind::Retired { error: Some(error) } => return Err(error.clone()),
            ActionKind::Retired { error: None } => {
                let shown = option_string.unwrap_or(&arg.dest);
                let warning = format!(
                    "\u{1b}[1;33mThe command line argument '{shown}' is deprecated and will be removed in future versions.\u{1b}[0m"
                );
                return Ok((current.cloned().unwrap_or(Value::Null), Some(warning)));
            }
            _ => {}
        }
        Ok(self.apply_infallible(arg, current, values, option_string))
    }

    fn apply_infallible(
        &self,
        arg: &Argument,
        current: Option<&Value>,
        values: Value,
        option_string: Option<&str>,
    ) -> (Value, Option<String>) {
        let list = || match current {
            Some(Value::Array(items)) => items.clone(),
            _ => Vec::new(),
        };
        match self {
            ActionKind::Store
            | ActionKind::Help
            | ActionKind::Version
            | ActionKind::LoraModules
            | ActionKind::Retired { .. } => (values, None),
            ActionKind::Const(v) => (v.clone(), None),
            ActionKind::Append => {
                let mut items = list();
                items.push(values);
                (Value::Array(items), None)
            }
            ActionKind::AppendConst(v) => {
                let mut items = list();
                items.push(v.clone());
                (Value::Array(items), None)
            }
            ActionKind::Extend => {
                let mut items = list();
                if let Value::Array(more) = values {
                    items.extend(more);
                }
                (Value::Array(items), None)
            }
            ActionKind::Count => {
                let count = current.and_then(Value::as_i64).unwrap_or(0);
                (Value::from(count + 1), None)
            }
            ActionKind::BooleanOptional => {
                // argparse acts only for the spellings it generated; vLLM's
                // hidden extra spellings store what the data recorded.
                let stored = match option_string {
                    // vLLM's EnableDisableAction adds `--disable-x`; the data
                    // records what every spelling stores.
                    Some(s) if arg.flag_values.contains_key(s) => arg.flag_values[s].clone(),
                    Some(s) if arg.flags.iter().any(|f| f == s) => {
                        Value::Bool(!s.starts_with("--no-"))
                    }
                    Some(s) => arg
                        .flag_values
                        .get(s)
                        .cloned()
                        .unwrap_or_else(|| current.cloned().unwrap_or(Value::Null)),
                    None => current.cloned().unwrap_or(Value::Null),
                };
                (stored, None)
            }
            ActionKind::Deprecated { new_flag, stores } => {
                let replacement = new_flag
                    .as_ref()
                    .map(|f| format!(" Use '{f}' instead."))
                    .unwrap_or_default();
                let shown = option_string.unwrap_or(&arg.dest);
                let warning = format!(
                    "\u{1b}[1;33m'{shown}' is deprecated and will be removed in a future release.{replacement}\u{1b}[0m"
                );
                (stores.clone().unwrap_or(values), Some(warning))
            }
            ActionKind::LoraPaths => {
                let items = match values {
                    Value::Array(items) => items,
                    Value::Null => Vec::new(),
                    one => vec![one],
                };
                let paths = items
                    .into_iter()
                    .map(|item| match item {
                        Value::String(s) => {
                            let s = s.trim();
                            if s.starts_with('{') && s.ends_with('}') {
                                crate::pyjson::loads(s, crate::pyjson::Dialect::Python)
                                    .unwrap_or_else(|_| Value::String(s.to_string()))
                            } else {
                                Value::String(s.to_string())
                            }
                        }
                        other => other,
                    })
                    .collect();
                (Value::Array(paths), None)
            }
        }
    }

    /// Whether the action takes no values whatever its `nargs` says.
    pub fn is_help(&self) -> bool {
        matches!(self, ActionKind::Help | ActionKind::Version)
    }
}

/// vLLM's `LoRAParserAction`: `name=path`, or a JSON object with `name`,
/// `path` and optionally `base_model_name`.
fn lora_modules(values: Value) -> Result<Value, String> {
    let items = match values {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        one => vec![one],
    };
    let mut modules = Vec::new();
    for item in items {
        let Value::String(item) = item else { continue };
        if item.is_empty() {
            continue;
        }
        if item.contains('=') && !item.contains(',') {
            let (name, path) = item.split_once('=').unwrap_or((&item, ""));
            modules.push(serde_json::json!({"name": name, "path": path, "base_model_name": null}));
            continue;
        }
        let decoded = crate::pyjson::loads(&item, crate::pyjson::Dialect::Python)
            .map_err(|_| format!("Invalid JSON format for --lora-modules: {item}"))?;
        let fields = |why: String| format!("Invalid fields for --lora-modules: {item} - {why}");
        let Value::Object(map) = &decoded else {
            return Err(fields(format!(
                "LoRAModulePath() argument after ** must be a mapping, not {}",
                crate::pyjson::type_name(&decoded)
            )));
        };
        if let Some(extra) = map
            .keys()
            .find(|k| !["name", "path", "base_model_name"].contains(&k.as_str()))
        {
            return Err(fields(format!(
                "LoRAModulePath.__init__() got an unexpected keyword argument '{extra}'"
            )));
        }
        let missing: Vec<String> = ["name", "path"]
            .iter()
            .filter(|k| !map.contains_key(**k))
            .map(|k| format!("'{k}'"))
            .collect();
        match missing.len() {
            0 => modules.push(decoded),
            1 => {
                return Err(fields(format!(
                    "LoRAModulePath.__init__() missing 1 required positional argument: {}",
                    missing[0]
                )));
            }
            _ => {
                return Err(fields(format!(
                    "LoRAModulePath.__init__() missing 2 required positional arguments: {} and {}",
                    missing[0], missing[1]
                )));
            }
        }
    }
    Ok(Value::Array(modules))
}

fn new_flag(arg: &Argument) -> Option<String> {
    arg.action_attrs
        .get("new_flag")
        .and_then(Value::as_str)
        .map(str::to_string)
}
