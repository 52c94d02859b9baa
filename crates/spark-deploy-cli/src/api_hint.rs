//! What `up` prints last: where the API is, how to get its key, and an OpenAI-client snippet.

use spark_deploy_core::config::{ApiAuth, ValidatedConfig};

/// How to call a deployment's API.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ApiHint {
    /// The base URL by the head's address (its host name when the API binds every address).
    pub(crate) base_url: String,
    /// The base URL on the head itself.
    pub(crate) local_base_url: String,
    /// `key` or `none`.
    pub(crate) auth: ApiAuth,
    /// The command that prints the key (`None` without a key).
    pub(crate) key_command: Option<String>,
    /// The served model id.
    pub(crate) model: String,
}

/// The head's name as other machines reach it, for an API bound to every address.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "<head's address>".to_owned())
}

impl ApiHint {
    /// The hint for `config`; `config_arg` is the `--config FILE` a later command needs (if any).
    pub(crate) fn new(config: &ValidatedConfig, config_arg: Option<&str>) -> Self {
        let s = &config.config().serving;
        let ip = s.host.parse::<std::net::IpAddr>().ok();
        let head = match ip {
            Some(ip) if ip.is_unspecified() => host_name(),
            Some(ip) if ip.is_loopback() => "127.0.0.1".to_owned(),
            Some(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => s.host.clone(),
        };
        let local = match ip {
            Some(ip) if ip.is_unspecified() || ip.is_loopback() => "127.0.0.1".to_owned(),
            _ => head.clone(),
        };
        let config_flag = config_arg.map_or_else(String::new, |c| format!(" --config {c}"));
        Self {
            base_url: format!("http://{head}:{}/v1", s.port),
            local_base_url: format!("http://{local}:{}/v1", s.port),
            auth: s.auth,
            key_command: (s.auth == ApiAuth::Key)
                .then(|| format!("spark-deploy{config_flag} api-key")),
            model: config.config().model.served_name.clone(),
        }
    }

    /// The three lines of Python that call the API with the OpenAI client.
    pub(crate) fn snippet(&self) -> [String; 3] {
        let key = match self.auth {
            ApiAuth::Key => String::new(),
            ApiAuth::None => ", api_key=\"none\"".to_owned(),
        };
        [
            "from openai import OpenAI".to_owned(),
            format!("client = OpenAI(base_url=\"{}\"{key})", self.local_base_url),
            format!(
                "print(client.chat.completions.create(model=\"{}\", messages=[{{\"role\": \"user\", \"content\": \"Hello\"}}]).choices[0].message.content)",
                self.model
            ),
        ]
    }

    /// The text printed after `up`.
    pub(crate) fn text(&self) -> String {
        let mut out = format!(
            "API (OpenAI-compatible): {}  (on the head: {})\n",
            self.base_url, self.local_base_url
        );
        match &self.key_command {
            Some(cmd) => out.push_str(&format!(
                "Key: `{cmd}` prints it; send it as `Authorization: Bearer <key>`.\n\
                 Python (openai package), after `export OPENAI_API_KEY=$({cmd})`:\n"
            )),
            None => out.push_str(
                "Key: none (serving.auth = \"none\"): anyone who reaches the port may call it.\n\
                 Python (openai package):\n",
            ),
        }
        for line in self.snippet() {
            out.push_str(&format!("    {line}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml: &str) -> ValidatedConfig {
        let raw = spark_deploy_core::config::parse(toml, std::path::Path::new("t.toml")).unwrap();
        spark_deploy_core::config::validate(raw, std::path::Path::new("/home/u")).unwrap()
    }

    #[test]
    fn the_hint_names_both_urls_the_key_command_and_three_lines() {
        let h = ApiHint::new(&config(""), Some("/etc/sd.toml"));
        assert_eq!(h.local_base_url, "http://127.0.0.1:8888/v1");
        assert!(h.base_url.ends_with(":8888/v1") && !h.base_url.contains("0.0.0.0"));
        let t = h.text();
        assert!(
            t.contains("`spark-deploy --config /etc/sd.toml api-key`"),
            "{t}"
        );
        assert!(
            t.contains("    client = OpenAI(base_url=\"http://127.0.0.1:8888/v1\")\n"),
            "{t}"
        );
        let open = ApiHint::new(
            &config("[serving]\nauth = \"none\"\nhost = \"127.0.0.1\"\nport = 9000\n"),
            None,
        );
        assert_eq!(open.base_url, "http://127.0.0.1:9000/v1");
        assert_eq!(open.key_command, None);
        assert!(open.snippet()[1].ends_with("api_key=\"none\")"));
        assert!(open.text().contains("Key: none"));
    }
}
