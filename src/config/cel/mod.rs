//! Counter filters and derived fields in CEL (the Common Expression Language Envoy and Kuadrant
//! use): `status >= 500 && method == "POST"`, `string(status / 100) + "xx"`.
//!
//! cel's parser reads the text; the tree is compiled here, once with the model, into a small
//! evaluator over the event's decoded fields ([`Program::eval`]): no allocation per event
//! unless an expression builds a string. The subset: literals (bool, int, uint, double, string,
//! null), field names (a dotted name such as `request.method` reads that path), `has(a.b)`,
//! `! && || ?:`, comparisons, `+ - * / %`, `in [literals]`, `size`, `startsWith`, `endsWith`,
//! `contains`, `lowerAscii`, `upperAscii`, `string`, `int`, `double`. Anything else is refused
//! with its position. A field the event does not have reads as `null`.

mod eval;

use std::borrow::Cow;

use cel::common::ast::{Expr, LiteralValue};
use cel::parser::Parser;
use cel::IdedExpr;

pub use eval::{EvalError, Val};

/// A compiled expression and the fields it reads.
#[derive(Debug, Clone)]
pub struct Program {
    node: CelNode,
    /// The field names it reads, in `CelNode::Var` order.
    vars: Vec<String>,
}

/// Comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Arithmetic operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// Functions (called as `f(x)` or `x.f()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    Size,
    StartsWith,
    EndsWith,
    Contains,
    Lower,
    Upper,
    String,
    Int,
    Double,
}

/// The compiled tree.
#[derive(Debug, Clone)]
pub(crate) enum CelNode {
    Lit(Val<'static>),
    Var(usize),
    Has(usize),
    Not(Box<CelNode>),
    Neg(Box<CelNode>),
    And(Box<CelNode>, Box<CelNode>),
    Or(Box<CelNode>, Box<CelNode>),
    Cmp(Cmp, Box<CelNode>, Box<CelNode>),
    Arith(Arith, Box<CelNode>, Box<CelNode>),
    Cond(Box<CelNode>, Box<CelNode>, Box<CelNode>),
    In(Box<CelNode>, Vec<Val<'static>>),
    Call(Func, Vec<CelNode>),
}

/// What an expression is known to give before it runs (`None`: depends on the event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExprKind {
    Bool,
    Number,
    Text,
    Null,
}

/// Where in an expression's text (1-based line and column, in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The line.
    pub line: usize,
    /// The column.
    pub column: usize,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Why an expression does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// Not CEL: the parser's message, where it stopped.
    #[error("{at}: {message}")]
    Syntax {
        /// Where.
        at: Position,
        /// What the parser says (or what it means, where it speaks of its internals).
        message: String,
    },
    /// Not CEL the parser could place.
    #[error("{0}")]
    Unparsed(String),
    /// CEL that tally does not evaluate (a function, an operator, a literal type), and what to
    /// write instead.
    #[error("{at}: {what}")]
    Unsupported {
        /// Where.
        at: Position,
        /// What is not supported.
        what: String,
    },
    /// A filter that gives something other than a condition (its kind named).
    #[error("a filter is a condition (true: the event counts), this gives a {0}")]
    NotACondition(&'static str),
}

impl Program {
    /// Compiles `text`; the error says what is wrong and where (line:column).
    pub fn compile(text: &str) -> Result<Program, CelError> {
        let (expr, info) = Parser::new()
            .max_recursion_depth(64)
            .parse_with_source_info(text)
            .map_err(|e| match e.errors.first() {
                // The parser's positions are line:column, both 1-based already.
                Some(e) => CelError::Syntax {
                    at: Position {
                        line: e.pos.0 as usize,
                        column: e.pos.1 as usize,
                    },
                    message: parse_message(&e.msg),
                },
                None => CelError::Unparsed(e.to_string()),
            })?;
        let mut c = Compiler {
            vars: Vec::new(),
            at: |id: u64| match info.offset_for(id) {
                Some((start, _)) => position(text, start as usize),
                None => Position { line: 1, column: 1 },
            },
        };
        let node = c.node(&expr)?;
        Ok(Program { node, vars: c.vars })
    }

    /// Compiles a filter: an expression that must give a bool.
    pub fn filter(text: &str) -> Result<Program, CelError> {
        let p = Program::compile(text)?;
        match kind(&p.node) {
            Some(ExprKind::Bool) | None => Ok(p),
            Some(k) => Err(CelError::NotACondition(match k {
                ExprKind::Number => "number",
                ExprKind::Text => "string",
                _ => "null",
            })),
        }
    }

    /// The field names it reads; `vars[i]` is `Var(i)`.
    pub fn vars(&self) -> &[String] {
        &self.vars
    }

    /// Runs it on the values of [`Program::vars`] (`Val::Null` for a field the event lacks).
    pub fn eval<'v>(&'v self, vars: &'v [Val<'_>]) -> Result<Val<'v>, EvalError> {
        self.eval_with(&|i| match &vars[i] {
            Val::Str(s) => Val::Str(Cow::Borrowed(s)),
            v => v.clone(),
        })
    }

    /// [`Program::eval`] reading `Var(i)` from `var(i)` when the expression needs it (nothing
    /// gathered beforehand).
    #[inline]
    pub fn eval_with<'v, F: Fn(usize) -> Val<'v>>(&'v self, var: &F) -> Result<Val<'v>, EvalError> {
        eval::eval(&self.node, var)
    }

    /// Runs a filter (true counts the event), reading fields as [`Program::eval_with`] does.
    #[inline]
    pub fn test_with<'v, F: Fn(usize) -> Val<'v>>(&'v self, var: &F) -> Result<bool, EvalError> {
        match self.eval_with(var)? {
            Val::Bool(b) => Ok(b),
            _ => Err(EvalError::NotBool),
        }
    }
}

/// The parser's message, or what it means where the parser speaks of its own internals.
fn parse_message(msg: &str) -> String {
    if msg.contains("`_?_:_`") {
        // `c ? a` without its `: b`: the parser says "Incomplete `ExprContext`".
        return "a conditional needs both branches: `condition ? then : else`".to_string();
    }
    msg.to_string()
}

/// `line:column` (1-based, in characters) of a character offset.
fn position(text: &str, offset: usize) -> Position {
    let before: String = text.chars().take(offset).collect();
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Position { line, column }
}

struct Compiler<F> {
    vars: Vec<String>,
    at: F,
}

impl<F: Fn(u64) -> Position> Compiler<F> {
    fn refuse<T>(&self, e: &IdedExpr, what: impl std::fmt::Display) -> Result<T, CelError> {
        Err(CelError::Unsupported {
            at: (self.at)(e.id),
            what: what.to_string(),
        })
    }

    fn var(&mut self, name: String) -> usize {
        match self.vars.iter().position(|v| *v == name) {
            Some(i) => i,
            None => {
                self.vars.push(name);
                self.vars.len() - 1
            }
        }
    }

    fn boxed(&mut self, e: &IdedExpr) -> Result<Box<CelNode>, CelError> {
        self.node(e).map(Box::new)
    }

    fn node(&mut self, e: &IdedExpr) -> Result<CelNode, CelError> {
        match &e.expr {
            Expr::Literal(l) => literal(l).map(CelNode::Lit).or_else(|w| self.refuse(e, w)),
            Expr::Ident(name) => Ok(CelNode::Var(self.var(name.clone()))),
            Expr::Select(s) if s.test => match dotted(&s.operand.expr) {
                Some(path) => Ok(CelNode::Has(self.var(format!("{path}.{}", s.field)))),
                None => self.refuse(e, "has() takes a field name such as `has(request.method)`"),
            },
            Expr::Select(_) => match dotted(&e.expr) {
                Some(path) => Ok(CelNode::Var(self.var(path))),
                None => self.refuse(e, "a field is selected from a field name only"),
            },
            Expr::List(_) => self.refuse(e, "a list is allowed only after `in`"),
            Expr::Call(call) => self.call(e, &call.func_name, call.target.as_deref(), &call.args),
            Expr::Map(_) | Expr::Struct(_) => self.refuse(e, "maps and messages are not supported"),
            Expr::Comprehension(_) => {
                self.refuse(e, "macros (all, exists, map, filter) are not supported")
            }
            Expr::Unspecified => self.refuse(e, "empty expression"),
        }
    }

    fn call(
        &mut self,
        e: &IdedExpr,
        name: &str,
        target: Option<&IdedExpr>,
        args: &[IdedExpr],
    ) -> Result<CelNode, CelError> {
        use cel::common::ast::operators as op;
        let two = |c: &mut Self| -> Result<(Box<CelNode>, Box<CelNode>), CelError> {
            Ok((c.boxed(&args[0])?, c.boxed(&args[1])?))
        };
        let cmp = |c: &mut Self, o| two(c).map(|(a, b)| CelNode::Cmp(o, a, b));
        let arith = |c: &mut Self, o| two(c).map(|(a, b)| CelNode::Arith(o, a, b));
        match (name, target, args.len()) {
            (op::LOGICAL_AND, None, 2) => two(self).map(|(a, b)| CelNode::And(a, b)),
            (op::LOGICAL_OR, None, 2) => two(self).map(|(a, b)| CelNode::Or(a, b)),
            (op::LOGICAL_NOT, None, 1) => Ok(CelNode::Not(self.boxed(&args[0])?)),
            (op::NEGATE, None, 1) => Ok(CelNode::Neg(self.boxed(&args[0])?)),
            (op::CONDITIONAL, None, 3) => Ok(CelNode::Cond(
                self.boxed(&args[0])?,
                self.boxed(&args[1])?,
                self.boxed(&args[2])?,
            )),
            (op::EQUALS, None, 2) => cmp(self, Cmp::Eq),
            (op::NOT_EQUALS, None, 2) => cmp(self, Cmp::Ne),
            (op::LESS, None, 2) => cmp(self, Cmp::Lt),
            (op::LESS_EQUALS, None, 2) => cmp(self, Cmp::Le),
            (op::GREATER, None, 2) => cmp(self, Cmp::Gt),
            (op::GREATER_EQUALS, None, 2) => cmp(self, Cmp::Ge),
            (op::ADD, None, 2) => arith(self, Arith::Add),
            (op::SUBSTRACT, None, 2) => arith(self, Arith::Sub),
            (op::MULTIPLY, None, 2) => arith(self, Arith::Mul),
            (op::DIVIDE, None, 2) => arith(self, Arith::Div),
            (op::MODULO, None, 2) => arith(self, Arith::Rem),
            (op::IN, None, 2) => self.in_list(&args[0], &args[1]),
            (op::INDEX, ..) => self.refuse(
                e,
                "indexing is not supported; read the element with [decode.fields] (e.g. `items[0].sku`)",
            ),
            _ => self.function(e, name, target, args),
        }
    }

    /// `value in [literal, ...]`.
    fn in_list(&mut self, value: &IdedExpr, list: &IdedExpr) -> Result<CelNode, CelError> {
        let Expr::List(list_expr) = &list.expr else {
            return self.refuse(
                list,
                "`in` takes a list of literals, e.g. `method in [\"GET\", \"HEAD\"]`",
            );
        };
        let mut items = Vec::with_capacity(list_expr.elements.len());
        for item in &list_expr.elements {
            match &item.expr {
                Expr::Literal(l) => items.push(literal(l).or_else(|w| self.refuse(item, w))?),
                _ => return self.refuse(item, "`in` takes a list of literals"),
            }
        }
        Ok(CelNode::In(self.boxed(value)?, items))
    }

    /// A supported function `name`, called on `target` (a method) or with `args` alone.
    fn function(
        &mut self,
        e: &IdedExpr,
        name: &str,
        target: Option<&IdedExpr>,
        args: &[IdedExpr],
    ) -> Result<CelNode, CelError> {
        let func = match name {
            "size" => Func::Size,
            "startsWith" => Func::StartsWith,
            "endsWith" => Func::EndsWith,
            "contains" => Func::Contains,
            "lowerAscii" => Func::Lower,
            "upperAscii" => Func::Upper,
            "string" => Func::String,
            "int" => Func::Int,
            "double" => Func::Double,
            _ => {
                return self.refuse(
                    e,
                    format!("function `{name}` is not supported (supported: size, startsWith, endsWith, contains, lowerAscii, upperAscii, string, int, double)"),
                )
            }
        };
        let arity = match func {
            Func::StartsWith | Func::EndsWith | Func::Contains => 2,
            _ => 1,
        };
        let mut all: Vec<CelNode> = Vec::with_capacity(arity);
        if let Some(t) = target {
            all.push(self.node(t)?);
        }
        for a in args {
            all.push(self.node(a)?);
        }
        let method_only = matches!(
            func,
            Func::StartsWith | Func::EndsWith | Func::Contains | Func::Lower | Func::Upper
        );
        if all.len() != arity || (method_only && target.is_none()) {
            return self.refuse(
                e,
                format!(
                    "`{name}` takes {} (e.g. {})",
                    if arity == 2 {
                        "a receiver and one argument"
                    } else {
                        "one value"
                    },
                    if method_only {
                        format!("`path.{name}(…)`")
                    } else {
                        format!("`{name}(x)`")
                    }
                ),
            );
        }
        Ok(CelNode::Call(func, all))
    }
}

/// `a.b.c` of an identifier and field selections on it (`None`: anything else).
fn dotted(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(s) if !s.test => dotted(&s.operand.expr).map(|p| format!("{p}.{}", s.field)),
        _ => None,
    }
}

/// A literal's value (bytes are refused).
fn literal(l: &LiteralValue) -> Result<Val<'static>, &'static str> {
    Ok(match l {
        LiteralValue::Boolean(b) => Val::Bool(*b.inner()),
        LiteralValue::Int(i) => Val::Int(*i.inner()),
        LiteralValue::UInt(u) => Val::UInt(*u.inner()),
        LiteralValue::Double(d) => Val::Double(*d.inner()),
        LiteralValue::String(s) => Val::Str(Cow::Owned(s.inner().to_string())),
        LiteralValue::Null => Val::Null,
        LiteralValue::Bytes(_) => return Err("bytes literals are not supported"),
    })
}

/// What `node` gives whatever the event (for refusing a filter that is no condition).
fn kind(node: &CelNode) -> Option<ExprKind> {
    match node {
        CelNode::Lit(Val::Bool(_)) => Some(ExprKind::Bool),
        CelNode::Lit(Val::Str(_)) => Some(ExprKind::Text),
        CelNode::Lit(Val::Null) => Some(ExprKind::Null),
        CelNode::Lit(_) | CelNode::Neg(_) => Some(ExprKind::Number),
        CelNode::Has(_)
        | CelNode::Not(_)
        | CelNode::And(..)
        | CelNode::Or(..)
        | CelNode::Cmp(..)
        | CelNode::In(..) => Some(ExprKind::Bool),
        CelNode::Call(Func::StartsWith | Func::EndsWith | Func::Contains, _) => {
            Some(ExprKind::Bool)
        }
        CelNode::Call(Func::Size | Func::Int | Func::Double, _) => Some(ExprKind::Number),
        CelNode::Call(Func::String | Func::Lower | Func::Upper, _) => Some(ExprKind::Text),
        CelNode::Cond(_, a, b) => kind(a).filter(|k| Some(*k) == kind(b)),
        // Arithmetic gives a number or a string, or fails: either known side tells which.
        CelNode::Arith(_, a, b) => [kind(a), kind(b)]
            .into_iter()
            .flatten()
            .find(|k| matches!(k, ExprKind::Number | ExprKind::Text)),
        CelNode::Var(_) => None,
    }
}

#[cfg(test)]
mod tests;
