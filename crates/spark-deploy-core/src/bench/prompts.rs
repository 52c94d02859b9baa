//! The prompt sets `bench` ships: prose, code and structured text, four each. Every request
//! appends ` (variant …)` so no two requests share a prompt (no prefix-cache hits).

use serde::Serialize;

/// What a prompt asks the model to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Natural-language prose.
    Prose,
    /// Source code.
    Code,
    /// JSON / tables.
    Structured,
}

impl Kind {
    /// Every kind, in table order.
    pub const ALL: [Self; 3] = [Self::Prose, Self::Code, Self::Structured];

    /// `prose`, `code`, `structured`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Prose => "prose",
            Self::Code => "code",
            Self::Structured => "structured",
        }
    }

    /// The kind named `s`.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == s.trim())
    }

    /// The set's prompts.
    #[must_use]
    pub fn prompts(self) -> &'static [&'static str] {
        match self {
            Self::Prose => PROSE,
            Self::Code => CODE,
            Self::Structured => STRUCTURED,
        }
    }
}

const PROSE: &[&str] = &[
    "Write a long, detailed essay about the history of lighthouses and the people who kept them, with the storms they saw and the ships they saved.",
    "Tell a long story about a small fishing town in winter, the families who live there, and the day the harbour froze over.",
    "Explain in a long, careful essay how the printing press changed the way people in Europe read, argued and learned.",
    "Describe, in a long travel essay, a journey by train across a mountain range, the villages on the way and the people one meets.",
];

const CODE: &[&str] = &[
    "Complete and extend this Rust module with tests:\n```rust\npub struct Stack<T> { items: Vec<T> }\nimpl<T> Stack<T> {\n    pub fn new() -> Self { Self { items: Vec::new() } }\n    pub fn push(&mut self, t: T) { self.items.push(t); }\n    pub fn pop(&mut self) -> Option<T> {\n```",
    "Write the rest of this Python class, with docstrings and unit tests:\n```python\nclass LRUCache:\n    def __init__(self, capacity: int):\n        self.capacity = capacity\n        self.data = {}\n    def get(self, key):\n```",
    "Implement this C function and a main() that tests it:\n```c\n/* returns the number of words in s; words are separated by spaces */\nint count_words(const char *s) {\n    int n = 0;\n    for (; *s; s++) {\n```",
    "Finish this TypeScript module with types and tests:\n```ts\nexport function parseCsv(text: string): string[][] {\n  const rows: string[][] = [];\n  for (const line of text.split('\\n')) {\n```",
];

const STRUCTURED: &[&str] = &[
    "Continue this JSON array with 40 more records of the same shape: [{\"id\": 1, \"name\": \"Ada\", \"city\": \"London\", \"tags\": [\"math\", \"code\"]}, {\"id\": 2, \"name\": \"Alan\", \"city\": \"Manchester\", \"tags\": [\"logic\"]},",
    "Extend this markdown table to 40 rows: | id | product | price | stock |\n|---|---|---|---|\n| 1 | \"lamp\" | 12.50 | 40 |\n| 2 | \"chair\" | 45.00 | 12 |",
    "Write 40 more lines of this CSV: \"date\",\"city\",\"temp_c\",\"rain_mm\"\n\"2024-01-01\",\"Oslo\",-3,1.2\n\"2024-01-02\",\"Oslo\",-5,0.0",
    "Continue this YAML-like JSON config with 30 more services: {\"services\": [{\"name\": \"api\", \"port\": 8080, \"replicas\": 3}, {\"name\": \"db\", \"port\": 5432, \"replicas\": 1},",
];

/// Prompt `i` of `kind`, varied by `variant`.
#[must_use]
pub fn prompt(kind: Kind, i: usize, variant: &str) -> String {
    let p = kind.prompts();
    format!("{} (variant {variant})", p[i % p.len()])
}

/// A cold filler prompt of about `bytes` bytes: random words after a unique `nonce` (first, so
/// no prefix of it was ever cached).
#[must_use]
pub fn filler(bytes: usize, nonce: u64) -> String {
    const WORDS: &[&str] = &[
        "amber", "valley", "quiet", "river", "stone", "market", "lantern", "harbour", "winter",
        "garden", "copper", "meadow", "signal", "window", "forest", "thread", "island", "candle",
    ];
    let mut s = format!("[{nonce:016x}] ");
    let mut x = nonce | 1;
    while s.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        s.push(' ');
    }
    s.push_str("\nSay OK.");
    s
}
