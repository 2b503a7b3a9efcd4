//! A Prometheus check's `successCondition`: comparisons of `result` with a
//! number, joined by `&&` (binding tighter) and `||`, with parentheses.
//! Small on purpose: a condition is read by whoever approves a release, and
//! one that cannot be evaluated must be refused when the spec is checked,
//! never found out during a wave.

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Condition {
    Compare(Op, f64),
    And(Box<Condition>, Box<Condition>),
    Or(Box<Condition>, Box<Condition>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Op {
    fn text(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Eq => "==",
            Op::Ne => "!=",
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Condition::Compare(op, n) => write!(f, "result {} {n}", op.text()),
            Condition::And(a, b) => write!(f, "({a} && {b})"),
            Condition::Or(a, b) => write!(f, "({a} || {b})"),
        }
    }
}

impl Condition {
    /// Whether a sample meets it. NaN meets nothing: a ratio over no
    /// traffic proves nothing.
    pub fn holds(&self, result: f64) -> bool {
        if result.is_nan() {
            return false;
        }
        match self {
            Condition::Compare(op, n) => match op {
                Op::Lt => result < *n,
                Op::Le => result <= *n,
                Op::Gt => result > *n,
                Op::Ge => result >= *n,
                Op::Eq => result == *n,
                Op::Ne => result != *n,
            },
            Condition::And(a, b) => a.holds(result) && b.holds(result),
            Condition::Or(a, b) => a.holds(result) || b.holds(result),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Result,
    Number(f64),
    Op(Op),
    And,
    Or,
    Open,
    Close,
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let two = |t: Token| (t, 2);
        let (token, len) = match (c, next) {
            (c, _) if c.is_whitespace() => {
                i += 1;
                continue;
            }
            ('<', Some('=')) => two(Token::Op(Op::Le)),
            ('>', Some('=')) => two(Token::Op(Op::Ge)),
            ('=', Some('=')) => two(Token::Op(Op::Eq)),
            ('!', Some('=')) => two(Token::Op(Op::Ne)),
            ('&', Some('&')) => two(Token::And),
            ('|', Some('|')) => two(Token::Or),
            ('<', _) => (Token::Op(Op::Lt), 1),
            ('>', _) => (Token::Op(Op::Gt), 1),
            ('(', _) => (Token::Open, 1),
            (')', _) => (Token::Close, 1),
            (c, _) if c.is_ascii_alphabetic() => {
                let word: String = chars[i..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
                    .collect();
                if word != "result" {
                    return Err(format!("unknown name {word:?} (only `result`)"));
                }
                (Token::Result, word.len())
            }
            (c, _) if c.is_ascii_digit() || c == '-' || c == '.' => {
                let number = number_at(&chars[i..]);
                let value: f64 = number
                    .parse()
                    .map_err(|_| format!("{number:?} is not a number"))?;
                (Token::Number(value), number.chars().count())
            }
            (c, _) => return Err(format!("unexpected {c:?}")),
        };
        out.push(token);
        i += len;
    }
    Ok(out)
}

/// The longest run that may be a number: a sign, digits and dots, and an
/// exponent (`1e-3`); `parse` judges it.
fn number_at(chars: &[char]) -> String {
    let mut end = 0;
    if chars.first() == Some(&'-') {
        end = 1;
    }
    while chars
        .get(end)
        .is_some_and(|c| c.is_ascii_digit() || *c == '.')
    {
        end += 1;
    }
    if chars.get(end).is_some_and(|c| *c == 'e' || *c == 'E') {
        end += 1;
        if chars.get(end).is_some_and(|c| *c == '-' || *c == '+') {
            end += 1;
        }
        while chars.get(end).is_some_and(char::is_ascii_digit) {
            end += 1;
        }
    }
    chars[..end].iter().collect()
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn take(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn or(&mut self, depth: usize) -> Result<Condition, String> {
        let mut left = self.and(depth)?;
        while self.peek() == Some(&Token::Or) {
            self.at += 1;
            left = Condition::Or(Box::new(left), Box::new(self.and(depth)?));
        }
        Ok(left)
    }

    fn and(&mut self, depth: usize) -> Result<Condition, String> {
        let mut left = self.term(depth)?;
        while self.peek() == Some(&Token::And) {
            self.at += 1;
            left = Condition::And(Box::new(left), Box::new(self.term(depth)?));
        }
        Ok(left)
    }

    fn term(&mut self, depth: usize) -> Result<Condition, String> {
        // Bounded nesting: the text is at most 256 characters anyway.
        if depth > 16 {
            return Err("nested too deep".into());
        }
        match self.take() {
            Some(Token::Open) => {
                let inner = self.or(depth + 1)?;
                match self.take() {
                    Some(Token::Close) => Ok(inner),
                    _ => Err("a `(` is not closed".into()),
                }
            }
            Some(Token::Result) => match (self.take(), self.take()) {
                (Some(Token::Op(op)), Some(Token::Number(n))) if n.is_finite() => {
                    Ok(Condition::Compare(op, n))
                }
                _ => Err("`result` must be followed by a comparison with a number".into()),
            },
            Some(Token::Number(n)) => match (self.take(), self.take()) {
                // `0.01 > result` reads as `result < 0.01`.
                (Some(Token::Op(op)), Some(Token::Result)) if n.is_finite() => {
                    Ok(Condition::Compare(flip(op), n))
                }
                _ => Err("a number must be compared with `result`".into()),
            },
            _ => Err("expected `result`, a number or `(`".into()),
        }
    }
}

fn flip(op: Op) -> Op {
    match op {
        Op::Lt => Op::Gt,
        Op::Le => Op::Ge,
        Op::Gt => Op::Lt,
        Op::Ge => Op::Le,
        same => same,
    }
}

pub fn parse(text: &str) -> Result<Condition, String> {
    let mut p = Parser {
        tokens: tokens(text)?,
        at: 0,
    };
    let c = p.or(0)?;
    match p.peek() {
        None => Ok(c),
        Some(t) => Err(format!("unexpected {t:?} after a whole condition")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_hold_as_written() {
        let c = parse("result < 0.01").unwrap();
        assert!(c.holds(0.001));
        assert!(!c.holds(0.01));
        assert!(!c.holds(f64::INFINITY));
        assert!(parse("result>=0.99").unwrap().holds(0.99));
        assert!(parse("0.01 > result").unwrap().holds(0.0));
        assert!(!parse("0.01 > result").unwrap().holds(0.5));
        assert!(parse("result == 0").unwrap().holds(0.0));
        assert!(parse("result != 0").unwrap().holds(-1.0));
        assert!(parse("result > -5").unwrap().holds(-4.0));
        assert!(parse("result < 1e-3").unwrap().holds(0.0005));
        assert!(!parse("result < 1E-3").unwrap().holds(0.002));
    }

    #[test]
    fn and_binds_tighter_than_or() {
        let c = parse("result < 1 || result > 5 && result < 6").unwrap();
        assert!(c.holds(0.5));
        assert!(c.holds(5.5));
        assert!(!c.holds(7.0));
        let c = parse("(result < 1 || result > 5) && result < 6").unwrap();
        assert!(!c.holds(7.0));
        assert!(c.holds(0.0));
    }

    #[test]
    fn nan_meets_nothing() {
        for text in ["result < 1", "result != 0", "result == 0 || result > 0"] {
            assert!(!parse(text).unwrap().holds(f64::NAN), "{text}");
        }
    }

    #[test]
    fn bad_conditions_are_refused_with_the_reason() {
        for (text, reason) in [
            ("", "expected `result`"),
            ("result", "followed by a comparison"),
            ("result < ", "followed by a comparison"),
            ("result < x", "unknown name \"x\""),
            ("rate < 1", "unknown name \"rate\""),
            ("result = 1", "unexpected '='"),
            ("result < 1 &&", "expected `result`"),
            ("(result < 1", "not closed"),
            ("result < 1)", "after a whole condition"),
            ("result < 1.2.3", "is not a number"),
            ("result < 1 result > 2", "after a whole condition"),
            ("1 < 2", "compared with `result`"),
            ("result < 1e999", "comparison with a number"),
            ("result < 1e", "is not a number"),
            (&"(".repeat(40), "nested too deep"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(reason), "{text}: {e}");
        }
    }

    #[test]
    fn display_reads_back_the_same() {
        let c = parse("result < 1 || result > 5 && result < 6").unwrap();
        assert_eq!(parse(&c.to_string()).unwrap(), c);
    }
}
