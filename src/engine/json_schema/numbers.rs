//! Numbers under bounds as exact regexes. Integers take any 64-bit bounds;
//! other numbers take decimal bounds (`0.5`, `-90`, `1e-9`) and are then
//! written as plain decimals, with no exponent, so that the regex can
//! compare them digit by digit.

use std::cmp::Ordering;

use serde_json::Value;

use super::unsupported;
use crate::engine::EngineError;

/// Any JSON integer.
pub(super) const INTEGER: &str = "-?(?:0|[1-9][0-9]*)";
/// Any JSON number.
pub(super) const NUMBER: &str = "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][-+]?[0-9]+)?";

/// An integer regex honouring integer bounds (exact).
pub(super) fn integer_regex(obj: &serde_json::Map<String, Value>) -> Result<String, EngineError> {
    // Bounds in i128 (exact for 64-bit integers, saturating for floats), so
    // `+ 1` and negation cannot overflow.
    let exact = |v: &Value, up: bool| -> Option<i128> {
        v.as_i64()
            .map(i128::from)
            .or_else(|| v.as_u64().map(i128::from))
            .or_else(|| v.as_f64().map(|f| (if up { f.ceil() } else { f.floor() }) as i128))
    };
    let mut lo = obj.get("minimum").and_then(|v| exact(v, true));
    let mut hi = obj.get("maximum").and_then(|v| exact(v, false));
    // Both forms may stand together: the tighter bound wins.
    match obj.get("exclusiveMinimum") {
        Some(Value::Bool(true)) => lo = lo.map(|x| x.saturating_add(1)),
        Some(v) if v.is_number() => lo = lo.max(exact(v, false).map(|x| x.saturating_add(1))),
        _ => {}
    }
    match obj.get("exclusiveMaximum") {
        Some(Value::Bool(true)) => hi = hi.map(|x| x.saturating_sub(1)),
        Some(v) if v.is_number() => {
            hi = match (hi, exact(v, true).map(|x| x.saturating_sub(1))) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        _ => {}
    }
    if let (Some(a), Some(b)) = (lo, hi) {
        if a > b {
            return Err(EngineError::Unsatisfiable(format!("no integer lies between {a} and {b}")));
        }
    }
    let (min, max) = (i128::from(i64::MIN), i128::from(i64::MAX));
    if lo.is_some_and(|l| l > max) || hi.is_some_and(|h| h < min) {
        return Err(unsupported("minimum", "integer bounds beyond 64 bits are not supported"));
    }
    // A bound far past the 64-bit range (`-1e300`) is taken as none.
    let lo = lo.filter(|&l| l >= min).map(|l| l as i64);
    let hi = hi.filter(|&h| h <= max).map(|h| h as i64);
    if lo.is_none() && hi.is_none() {
        return Ok(INTEGER.into());
    }
    Ok(int_range(lo, hi))
}

/// Regex for the integers in `[lo, hi]` (either end open).
fn int_range(lo: Option<i64>, hi: Option<i64>) -> String {
    let mut parts = Vec::new();
    // Negative part: -(|hi'|..=|lo|).
    if lo.is_none_or(|l| l < 0) {
        let neg_hi = hi.map(|h| h.min(-1));
        if neg_hi.is_none_or(|h| h <= -1) {
            let a = neg_hi.map(|h| h.unsigned_abs()).unwrap_or(1);
            let b = lo.map(|l| l.unsigned_abs());
            parts.push(format!("-(?:{})", nonneg_range(a, b)));
        }
    }
    // Non-negative part.
    if hi.is_none_or(|h| h >= 0) {
        let a = lo.map(|l| l.max(0) as u64).unwrap_or(0);
        let b = hi.map(|h| h as u64);
        parts.push(nonneg_range(a, b));
    }
    format!("(?:{})", parts.join("|"))
}

/// Regex for the non-negative integers in `[a, b]` (b open when `None`), no leading zeros.
fn nonneg_range(a: u64, b: Option<u64>) -> String {
    match b {
        Some(b) => bounded(a, b),
        None => {
            let digits = a.to_string().len();
            let top = 10u64.saturating_pow(digits as u32).saturating_sub(1);
            format!("{}|[1-9][0-9]{{{},}}", bounded(a, top.max(a)), digits)
        }
    }
}

fn bounded(a: u64, b: u64) -> String {
    // Split by number of digits, then by common prefix.
    let mut alts = Vec::new();
    let mut lo = a;
    while lo <= b {
        let digits = lo.to_string().len() as u32;
        let top = 10u64.saturating_pow(digits).saturating_sub(1).min(b);
        same_len(&lo.to_string(), &top.to_string(), &mut alts);
        if top == u64::MAX || top >= b {
            break;
        }
        lo = top + 1;
    }
    alts.join("|")
}

/// Numbers between two equal-length decimal strings.
fn same_len(lo: &str, hi: &str, out: &mut Vec<String>) {
    if lo == hi {
        out.push(lo.to_string());
        return;
    }
    let (l, h) = (lo.as_bytes(), hi.as_bytes());
    let common = l.iter().zip(h).take_while(|(x, y)| x == y).count();
    let prefix = &lo[..common];
    let rest = lo.len() - common - 1;
    let (ld, hd) = (l[common], h[common]);
    let lo_tail = &lo[common + 1..];
    let hi_tail = &hi[common + 1..];
    let all_zero = lo_tail.bytes().all(|c| c == b'0');
    let all_nine = hi_tail.bytes().all(|c| c == b'9');
    let any = |n: usize| if n == 0 { String::new() } else { format!("[0-9]{{{n}}}") };
    if all_zero && all_nine {
        out.push(format!("{prefix}[{}-{}]{}", ld as char, hd as char, any(rest)));
        return;
    }
    // lo's first digit with the rest of lo..=99…
    if all_zero {
        out.push(format!("{prefix}{}{}", ld as char, any(rest)));
    } else {
        let nines: String = "9".repeat(rest);
        let mut sub = Vec::new();
        same_len(lo_tail, &nines, &mut sub);
        out.extend(sub.into_iter().map(|s| format!("{prefix}{}{s}", ld as char)));
    }
    if hd > ld + 1 {
        out.push(format!("{prefix}[{}-{}]{}", (ld + 1) as char, (hd - 1) as char, any(rest)));
    }
    if all_nine {
        out.push(format!("{prefix}{}{}", hd as char, any(rest)));
    } else {
        let zeros: String = "0".repeat(rest);
        let mut sub = Vec::new();
        same_len(&zeros, hi_tail, &mut sub);
        out.extend(sub.into_iter().map(|s| format!("{prefix}{}{s}", hd as char)));
    }
}

/// A regex for the JSON numbers within the schema's bounds (`minimum`,
/// `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, in the draft 4 or the
/// later form). Without bounds, any number.
pub(super) fn number_regex(obj: &serde_json::Map<String, Value>) -> Result<String, EngineError> {
    let bound = |key: &str| -> Result<Option<Dec>, EngineError> {
        match obj.get(key) {
            Some(Value::Number(n)) => {
                Dec::parse(&n.to_string()).map(Some).ok_or_else(|| unsupported(key, &format!("cannot read the bound {n}")))
            }
            _ => Ok(None),
        }
    };
    let strict = |key: &str| obj.get(key) == Some(&Value::Bool(true));
    // (bound, strict); of two bounds on one side the tighter wins.
    let mut lo = bound("minimum")?.map(|d| (d, strict("exclusiveMinimum")));
    if let Some(x) = bound("exclusiveMinimum")? {
        if lo.as_ref().is_none_or(|(d, _)| x.cmp(d) != Ordering::Less) {
            lo = Some((x, true));
        }
    }
    let mut hi = bound("maximum")?.map(|d| (d, strict("exclusiveMaximum")));
    if let Some(x) = bound("exclusiveMaximum")? {
        if hi.as_ref().is_none_or(|(d, _)| x.cmp(d) != Ordering::Greater) {
            hi = Some((x, true));
        }
    }
    if lo.is_none() && hi.is_none() {
        return Ok(NUMBER.into());
    }
    let zero = Dec::default();
    let mut alts = Vec::new();
    // x >= 0, written without a sign: magnitudes from max(lo, 0) up to hi.
    // (Zero is never `neg`: `Dec::parse` normalises `-0`.)
    if hi.as_ref().is_none_or(|(h, _)| !h.neg) {
        let from = match &lo {
            Some((l, s)) if !l.neg => (l.clone(), *s),
            _ => (zero.clone(), false),
        };
        if let Some(r) = magnitudes(&from, hi.as_ref())? {
            alts.push(r);
        }
    }
    // x <= 0, written `-m`: m from max(-hi, 0) up to -lo.
    if lo.as_ref().is_none_or(|(l, _)| l.neg || l.is_zero()) {
        let from = match &hi {
            Some((h, s)) if h.neg || h.is_zero() => (h.abs(), *s),
            _ => (zero.clone(), false),
        };
        let to = lo.as_ref().map(|(l, s)| (l.abs(), *s));
        if let Some(r) = magnitudes(&from, to.as_ref())? {
            alts.push(format!("-(?:{r})"));
        }
    }
    if alts.is_empty() {
        return Err(EngineError::Unsatisfiable("no number lies within the schema's bounds".into()));
    }
    Ok(format!("(?:{})", alts.join("|")))
}

/// A decimal number read exactly from its JSON text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Dec {
    neg: bool,
    /// Integer digits, no leading zeros (empty for 0).
    int: Vec<u8>,
    /// Fraction digits, no trailing zeros.
    frac: Vec<u8>,
}

/// Integer parts of bounds beyond this many digits are not written out.
const MAX_INT_DIGITS: usize = 19;

impl Dec {
    /// Reads `-12.5`, `1e-9`, `2.5E+3` (JSON number syntax); `None` past
    /// a few hundred digits of shift.
    fn parse(text: &str) -> Option<Dec> {
        let (neg, t) = match text.strip_prefix('-') {
            Some(t) => (true, t),
            None => (false, text),
        };
        let (mant, exp) = match t.find(['e', 'E']) {
            Some(i) => (&t[..i], t[i + 1..].parse::<i32>().ok()?),
            None => (t, 0),
        };
        if exp.abs() > 400 {
            return None;
        }
        let (ip, fp) = mant.split_once('.').unwrap_or((mant, ""));
        if !ip.bytes().chain(fp.bytes()).all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits: Vec<u8> = ip.bytes().chain(fp.bytes()).collect();
        // The decimal point sits after `point` digits.
        let point = ip.len() as i32 + exp;
        let mut int = Vec::new();
        let mut frac = Vec::new();
        for k in point.min(0)..(digits.len() as i32).max(point) {
            let d = if k >= 0 && (k as usize) < digits.len() { digits[k as usize] } else { b'0' };
            if k < point {
                int.push(d);
            } else {
                frac.push(d);
            }
        }
        let lead = int.iter().take_while(|&&d| d == b'0').count();
        int.drain(..lead);
        while frac.last() == Some(&b'0') {
            frac.pop();
        }
        let mut d = Dec { neg, int, frac };
        if d.is_zero() {
            d.neg = false;
        }
        Some(d)
    }

    fn is_zero(&self) -> bool {
        self.int.is_empty() && self.frac.is_empty()
    }

    fn abs(&self) -> Dec {
        Dec { neg: false, ..self.clone() }
    }

    /// Numeric order.
    fn cmp(&self, other: &Dec) -> Ordering {
        let mag = |a: &Dec, b: &Dec| a.int.len().cmp(&b.int.len()).then_with(|| a.int.cmp(&b.int)).then_with(|| a.frac.cmp(&b.frac));
        match (self.neg, other.neg) {
            (false, true) => Ordering::Greater,
            (true, false) => Ordering::Less,
            (false, false) => mag(self, other),
            (true, true) => mag(other, self),
        }
    }
}

/// The regex of the magnitudes `m` (written `int(.frac)?`, no sign, no
/// leading zeros, no exponent) with `from < m` (`<=` unless strict) and
/// `m < to` likewise (`to` open when `None`); `None` when there are none.
fn magnitudes(from: &(Dec, bool), to: Option<&(Dec, bool)>) -> Result<Option<String>, EngineError> {
    let (lo, ls) = from;
    if lo.int.len() > MAX_INT_DIGITS {
        return Err(unsupported("minimum", &format!("bounds past 1e{MAX_INT_DIGITS} on non-integer numbers are not supported")));
    }
    // An upper bound past the limit is lowered to it: only numbers of
    // twenty or more integer digits are lost.
    let to: Option<(Dec, bool)> = to.map(|(h, s)| {
        if h.int.len() > MAX_INT_DIGITS {
            (Dec { neg: false, int: vec![b'9'; MAX_INT_DIGITS], frac: Vec::new() }, false)
        } else {
            (h.clone(), *s)
        }
    });
    if let Some((h, hs)) = &to {
        match lo.cmp(h) {
            Ordering::Greater => return Ok(None),
            Ordering::Equal if *ls || *hs => return Ok(None),
            _ => {}
        }
    }
    let int_of = |d: &Dec| -> u64 { std::str::from_utf8(&d.int).ok().and_then(|s| s.parse().ok()).unwrap_or(0) };
    let la = int_of(lo);
    let mut alts = Vec::new();
    let with_frac = |int: String, f: (bool, Option<String>)| -> Option<String> {
        match f {
            (true, Some(r)) => Some(format!("{int}(?:\\.(?:{r}))?")),
            (true, None) => Some(int),
            (false, Some(r)) => Some(format!("{int}\\.(?:{r})")),
            (false, None) => None,
        }
    };
    match &to {
        Some((h, hs)) if int_of(h) == la => {
            alts.extend(with_frac(la.to_string(), fraction(&lo.frac, *ls, Some(&h.frac), *hs)));
        }
        _ => {
            alts.extend(with_frac(la.to_string(), fraction(&lo.frac, *ls, None, false)));
            let any_frac = "(?:\\.[0-9]+)?";
            match &to {
                None => alts.push(format!("(?:{}){any_frac}", nonneg_range(la + 1, None))),
                Some((h, hs)) => {
                    let ha = int_of(h);
                    if ha > la + 1 {
                        alts.push(format!("(?:{}){any_frac}", bounded(la + 1, ha - 1)));
                    }
                    alts.extend(with_frac(ha.to_string(), fraction(&[], false, Some(&h.frac), *hs)));
                }
            }
        }
    }
    Ok((!alts.is_empty()).then(|| alts.join("|")))
}

/// The digit strings `d` (possibly empty) with `0.l < 0.d` (`<=` unless
/// `ls`) and `0.d < 0.h` likewise (`h` open when `None`): whether the empty
/// string is one, and a regex for the non-empty ones.
fn fraction(l: &[u8], ls: bool, h: Option<&[u8]>, hs: bool) -> (bool, Option<String>) {
    let trim = |s: &[u8]| s[..s.len() - s.iter().rev().take_while(|&&d| d == b'0').count()].to_vec();
    let l = trim(l);
    let h = h.map(trim);
    match &h {
        None if l.is_empty() => return if ls { (false, Some("[0-9]*[1-9][0-9]*".into())) } else { (true, Some("[0-9]+".into())) },
        // Only zero is at most zero.
        Some(h) if h.is_empty() => return if hs || ls || !l.is_empty() { (false, None) } else { (true, Some("0+".into())) },
        _ => {}
    }
    let empty = l.is_empty() && !ls;
    let l0 = l.first().map_or(0, |d| d - b'0');
    let mut free = String::new();
    let mut alts = Vec::new();
    for c in 0..=9u8 {
        // What the rest must satisfy: `None` = anything, `Some(bound)` = recurse.
        let lower: Option<Option<(&[u8], bool)>> = match c.cmp(&l0) {
            Ordering::Less => continue,
            Ordering::Greater => Some(None),
            Ordering::Equal if l.is_empty() && !ls => Some(None),
            Ordering::Equal => Some(Some((l.get(1..).unwrap_or(&[]), ls))),
        };
        let upper: Option<Option<(&[u8], bool)>> = match &h {
            None => Some(None),
            Some(h) => match c.cmp(&(h[0] - b'0')) {
                Ordering::Less => Some(None),
                Ordering::Equal => Some(Some((&h[1..], hs))),
                Ordering::Greater => continue,
            },
        };
        match (lower.flatten(), upper.flatten()) {
            (None, None) => free.push((b'0' + c) as char),
            (lo, up) => {
                let (nl, nls) = lo.unwrap_or((&[], false));
                let sub = fraction(nl, nls, up.map(|u| u.0), up.is_some_and(|u| u.1));
                let d = (b'0' + c) as char;
                match sub {
                    (true, Some(r)) => alts.push(format!("{d}(?:{r})?")),
                    (true, None) => alts.push(d.to_string()),
                    (false, Some(r)) => alts.push(format!("{d}(?:{r})")),
                    (false, None) => {}
                }
            }
        }
    }
    if !free.is_empty() {
        alts.push(format!("[{free}][0-9]*"));
    }
    (empty, (!alts.is_empty()).then(|| alts.join("|")))
}
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integer_ranges_are_exact() {
        for (lo, hi) in
            [(Some(0), Some(150)), (Some(-20), Some(7)), (Some(5), None), (None, Some(-3)), (Some(123), Some(4567)), (Some(-5), Some(-5))]
        {
            let re = regex_automata::meta::Regex::new(&format!("^{}$", int_range(lo, hi))).unwrap();
            for n in -300i64..5000 {
                let inside = lo.is_none_or(|l| n >= l) && hi.is_none_or(|h| n <= h);
                assert_eq!(re.is_match(&n.to_string()), inside, "{n} in {lo:?}..={hi:?}: {}", int_range(lo, hi));
            }
            assert!(!re.is_match("007") && !re.is_match("-0"));
        }
    }

    /// Every bound form against a brute-force comparison over short decimals.
    #[test]
    fn decimal_ranges_are_exact() {
        let mut texts = Vec::new();
        for i in 0..=12 {
            for f in ["", ".0", ".00", ".05", ".1", ".25", ".5", ".50", ".501", ".75", ".9", ".99", ".999"] {
                texts.push(format!("{i}{f}"));
                texts.push(format!("-{i}{f}"));
            }
        }
        let value = |t: &str| t.parse::<f64>().unwrap();
        let schemas = [
            json!({"minimum": 0.5}),
            json!({"minimum": -2.25, "maximum": 3}),
            json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1}),
            json!({"minimum": 0, "exclusiveMinimum": true, "maximum": 5.5, "exclusiveMaximum": true}),
            json!({"minimum": -0.5, "maximum": -0.5}),
            json!({"maximum": -1.75}),
            json!({"exclusiveMaximum": 0}),
            json!({"minimum": 0}),
            json!({"minimum": 2.5, "maximum": 2.75}),
            json!({"minimum": 1e-1, "exclusiveMaximum": 1.2e1}),
            json!({"minimum": 3, "exclusiveMinimum": 3.5, "maximum": 10, "exclusiveMaximum": 9.99}),
        ];
        for schema in schemas {
            let obj = schema.as_object().unwrap();
            let rx = number_regex(obj).unwrap();
            let re = regex_automata::meta::Regex::new(&format!("^{rx}$")).unwrap();
            let get = |k: &str| obj.get(k).and_then(Value::as_f64);
            let flag = |k: &str| obj.get(k) == Some(&Value::Bool(true));
            for t in &texts {
                let x = value(t);
                let inside = get("minimum").is_none_or(|m| if flag("exclusiveMinimum") { x > m } else { x >= m })
                    && get("exclusiveMinimum").is_none_or(|m| x > m)
                    && get("maximum").is_none_or(|m| if flag("exclusiveMaximum") { x < m } else { x <= m })
                    && get("exclusiveMaximum").is_none_or(|m| x < m);
                assert_eq!(re.is_match(t), inside, "{t} against {schema}: {rx}");
            }
            assert!(!re.is_match("1e5") && !re.is_match("01") && !re.is_match("1.") && !re.is_match("+1"), "{schema}: {rx}");
        }
        assert!(matches!(number_regex(json!({"minimum": 2, "maximum": 1}).as_object().unwrap()), Err(EngineError::Unsatisfiable(_))));
        assert!(matches!(
            number_regex(json!({"exclusiveMinimum": 1, "exclusiveMaximum": 1}).as_object().unwrap()),
            Err(EngineError::Unsatisfiable(_))
        ));
    }

    #[test]
    fn bounds_are_read_exactly() {
        let d = |t: &str| Dec::parse(t).unwrap();
        assert_eq!(d("1e-3"), Dec { neg: false, int: vec![], frac: b"001".to_vec() });
        assert_eq!(d("-12.50E1"), Dec { neg: true, int: b"125".to_vec(), frac: vec![] });
        assert_eq!(d("-0.0"), Dec::default());
        assert_eq!(d("0.00123e2"), Dec { neg: false, int: vec![], frac: b"123".to_vec() });
        assert_eq!(d("-1").cmp(&d("-0.5")), Ordering::Less);
        assert!(Dec::parse("1e999").is_none());
        // A huge upper bound is lowered to 19 digits; a huge lower bound is an error.
        assert!(number_regex(json!({"maximum": 1e300}).as_object().unwrap()).is_ok());
        assert!(matches!(number_regex(json!({"minimum": 1e300}).as_object().unwrap()), Err(EngineError::Unsupported(_))));
    }
}
