//! The evaluator: CEL's semantics on the subset `Program` compiles (errors are values of
//! `&&`/`||`: `false && error` is false, `true || error` is true).

use std::borrow::Cow;
use std::cmp::Ordering;

use super::{Arith, CelNode, Cmp, Func};

/// A value: a decoded field, a literal or an intermediate result.
#[derive(Debug, Clone, PartialEq)]
pub enum Val<'a> {
    /// A missing field, or `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer literal (`1u`).
    UInt(u64),
    /// A double.
    Double(f64),
    /// A string, borrowed where it can be.
    Str(Cow<'a, str>),
}

/// Why an expression gave no value: the event is not counted by that counter (counted in a
/// metric with reason `filter_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// An operator or function met a value of a type it does not take (a missing field, too).
    #[error("a value has the wrong type")]
    Type,
    /// Integer overflow, or division or remainder by zero.
    #[error("integer overflow or division by zero")]
    Arithmetic,
    /// `int("x")` and the like.
    #[error("a value cannot be converted")]
    Conversion,
    /// A filter gave something other than a bool.
    #[error("a filter gave no bool")]
    NotBool,
}

type EvalOut<'v> = Result<Val<'v>, EvalError>;

/// Runs `node`; `var(i)` is the value of `Var(i)` (read when the expression needs it).
pub(super) fn eval<'v, F: Fn(usize) -> Val<'v>>(node: &'v CelNode, vars: &F) -> EvalOut<'v> {
    match node {
        CelNode::Lit(v) => Ok(borrow(v)),
        CelNode::Var(i) => Ok(vars(*i)),
        CelNode::Has(i) => Ok(Val::Bool(vars(*i) != Val::Null)),
        CelNode::Not(a) => match eval(a, vars)? {
            Val::Bool(b) => Ok(Val::Bool(!b)),
            _ => Err(EvalError::Type),
        },
        CelNode::Neg(a) => match eval(a, vars)? {
            Val::Int(n) => n.checked_neg().map(Val::Int).ok_or(EvalError::Arithmetic),
            Val::Double(d) => Ok(Val::Double(-d)),
            _ => Err(EvalError::Type),
        },
        CelNode::And(a, b) => logic(eval(a, vars), || eval(b, vars), false),
        CelNode::Or(a, b) => logic(eval(a, vars), || eval(b, vars), true),
        CelNode::Cond(c, a, b) => match eval(c, vars)? {
            Val::Bool(true) => eval(a, vars),
            Val::Bool(false) => eval(b, vars),
            _ => Err(EvalError::Type),
        },
        CelNode::Cmp(op, a, b) => compare(*op, &eval(a, vars)?, &eval(b, vars)?).map(Val::Bool),
        CelNode::Arith(op, a, b) => arith(*op, eval(a, vars)?, eval(b, vars)?),
        CelNode::In(a, items) => {
            let v = eval(a, vars)?;
            Ok(Val::Bool(items.iter().any(|i| equal(&v, i))))
        }
        CelNode::Call(f, args) => {
            let a = eval(&args[0], vars)?;
            match args.get(1) {
                Some(b) => call2(*f, &a, &eval(b, vars)?),
                None => call1(*f, a),
            }
        }
    }
}

fn borrow<'v>(v: &'v Val<'_>) -> Val<'v> {
    match v {
        Val::Str(s) => Val::Str(Cow::Borrowed(s)),
        Val::Null => Val::Null,
        Val::Bool(b) => Val::Bool(*b),
        Val::Int(n) => Val::Int(*n),
        Val::UInt(n) => Val::UInt(*n),
        Val::Double(d) => Val::Double(*d),
    }
}

/// `&&` (`short` false) and `||` (`short` true), commutative over errors as CEL defines them.
fn logic<'v>(a: EvalOut<'v>, b: impl FnOnce() -> EvalOut<'v>, short: bool) -> EvalOut<'v> {
    let a = match a {
        Ok(Val::Bool(x)) if x == short => return Ok(Val::Bool(short)),
        Ok(Val::Bool(_)) => Ok(()),
        Ok(_) => Err(EvalError::Type),
        Err(e) => Err(e),
    };
    match (a, b()) {
        (_, Ok(Val::Bool(x))) if x == short => Ok(Val::Bool(short)),
        (Ok(()), Ok(Val::Bool(x))) => Ok(Val::Bool(x)),
        (Err(e), _) => Err(e),
        (Ok(()), Ok(_)) => Err(EvalError::Type),
        (Ok(()), Err(e)) => Err(e),
    }
}

/// Numbers compare across int, uint and double; other types only with their own.
fn order(a: &Val<'_>, b: &Val<'_>) -> Option<Ordering> {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => Some(x.cmp(y)),
        (Val::UInt(x), Val::UInt(y)) => Some(x.cmp(y)),
        (Val::Int(x), Val::UInt(y)) => Some(i128::from(*x).cmp(&i128::from(*y))),
        (Val::UInt(x), Val::Int(y)) => Some(i128::from(*x).cmp(&i128::from(*y))),
        (Val::Double(x), Val::Double(y)) => x.partial_cmp(y),
        (Val::Double(x), Val::Int(y)) => x.partial_cmp(&(*y as f64)),
        (Val::Int(x), Val::Double(y)) => (*x as f64).partial_cmp(y),
        (Val::Double(x), Val::UInt(y)) => x.partial_cmp(&(*y as f64)),
        (Val::UInt(x), Val::Double(y)) => (*x as f64).partial_cmp(y),
        (Val::Str(x), Val::Str(y)) => Some(x.cmp(y)),
        (Val::Bool(x), Val::Bool(y)) => Some(x.cmp(y)),
        (Val::Null, Val::Null) => Some(Ordering::Equal),
        _ => None,
    }
}

/// Equality never fails: values of different types are unequal.
fn equal(a: &Val<'_>, b: &Val<'_>) -> bool {
    order(a, b) == Some(Ordering::Equal)
}

fn compare(op: Cmp, a: &Val<'_>, b: &Val<'_>) -> Result<bool, EvalError> {
    match op {
        Cmp::Eq => return Ok(equal(a, b)),
        Cmp::Ne => return Ok(!equal(a, b)),
        _ => {}
    }
    if matches!(a, Val::Null) || matches!(b, Val::Null) {
        return Err(EvalError::Type);
    }
    let o = order(a, b).ok_or(EvalError::Type)?;
    Ok(match op {
        Cmp::Lt => o.is_lt(),
        Cmp::Le => o.is_le(),
        Cmp::Gt => o.is_gt(),
        _ => o.is_ge(),
    })
}

fn arith<'v>(op: Arith, a: Val<'v>, b: Val<'v>) -> EvalOut<'v> {
    let int = |r: Option<i64>| r.map(Val::Int).ok_or(EvalError::Arithmetic);
    let uint = |r: Option<u64>| r.map(Val::UInt).ok_or(EvalError::Arithmetic);
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => int(match op {
            Arith::Add => x.checked_add(y),
            Arith::Sub => x.checked_sub(y),
            Arith::Mul => x.checked_mul(y),
            Arith::Div => x.checked_div(y),
            Arith::Rem => x.checked_rem(y),
        }),
        (Val::UInt(x), Val::UInt(y)) => uint(match op {
            Arith::Add => x.checked_add(y),
            Arith::Sub => x.checked_sub(y),
            Arith::Mul => x.checked_mul(y),
            Arith::Div => x.checked_div(y),
            Arith::Rem => x.checked_rem(y),
        }),
        (Val::Double(x), Val::Double(y)) => match op {
            Arith::Add => Ok(Val::Double(x + y)),
            Arith::Sub => Ok(Val::Double(x - y)),
            Arith::Mul => Ok(Val::Double(x * y)),
            Arith::Div => Ok(Val::Double(x / y)),
            Arith::Rem => Err(EvalError::Type),
        },
        (Val::Str(x), Val::Str(y)) if op == Arith::Add => {
            Ok(Val::Str(Cow::Owned(x.into_owned() + &y)))
        }
        _ => Err(EvalError::Type),
    }
}

fn call1(f: Func, a: Val<'_>) -> EvalOut<'_> {
    match (f, a) {
        (Func::Size, Val::Str(s)) => Ok(Val::Int(s.chars().count() as i64)),
        (Func::Lower, Val::Str(s)) => Ok(Val::Str(Cow::Owned(s.to_ascii_lowercase()))),
        (Func::Upper, Val::Str(s)) => Ok(Val::Str(Cow::Owned(s.to_ascii_uppercase()))),
        (Func::String, v) => Ok(Val::Str(match v {
            Val::Str(s) => s,
            Val::Int(n) => Cow::Owned(n.to_string()),
            Val::UInt(n) => Cow::Owned(n.to_string()),
            Val::Double(d) => Cow::Owned(d.to_string()),
            Val::Bool(b) => Cow::Borrowed(if b { "true" } else { "false" }),
            Val::Null => return Err(EvalError::Type),
        })),
        (Func::Int, v) => match v {
            Val::Int(n) => Ok(Val::Int(n)),
            Val::UInt(n) => i64::try_from(n)
                .map(Val::Int)
                .map_err(|_| EvalError::Conversion),
            Val::Double(d) if d.is_finite() && d > -9.2e18 && d < 9.2e18 => Ok(Val::Int(d as i64)),
            Val::Str(s) => s.parse().map(Val::Int).map_err(|_| EvalError::Conversion),
            Val::Null => Err(EvalError::Type),
            _ => Err(EvalError::Conversion),
        },
        (Func::Double, v) => match v {
            Val::Int(n) => Ok(Val::Double(n as f64)),
            Val::UInt(n) => Ok(Val::Double(n as f64)),
            Val::Double(d) => Ok(Val::Double(d)),
            Val::Str(s) => s
                .parse()
                .map(Val::Double)
                .map_err(|_| EvalError::Conversion),
            Val::Null => Err(EvalError::Type),
            Val::Bool(_) => Err(EvalError::Conversion),
        },
        _ => Err(EvalError::Type),
    }
}

fn call2<'v>(f: Func, a: &Val<'_>, b: &Val<'_>) -> EvalOut<'v> {
    let (Val::Str(a), Val::Str(b)) = (a, b) else {
        return Err(EvalError::Type);
    };
    Ok(Val::Bool(match f {
        Func::StartsWith => a.starts_with(&**b),
        Func::EndsWith => a.ends_with(&**b),
        _ => a.contains(&**b),
    }))
}
