//! Reading the alerts' PromQL with `promql-parser`: the operands of top-level set operators,
//! threshold comparisons, the metric names of vector selectors.

use promql_parser::parser::{self, Expr};
use promql_parser::util::{walk_expr, ExprVisitor};

use super::*;

/// `expr` as an AST; a query that does not parse fails the test here, naming it.
pub(crate) fn parse(expr: &str) -> Expr {
    parser::parse(expr).unwrap_or_else(|e| panic!("`{expr}` is not PromQL: {e}"))
}

/// The operands of the top-level `and` / `or` / `unless` operators of `expr`. A matching
/// clause (`on (...)`, `ignoring (...)`) belongs to the operator, so no operand carries one.
pub(crate) fn set_operands(expr: &Expr) -> Vec<Expr> {
    match expr {
        Expr::Binary(b) if b.op.is_set_operator() => {
            let mut operands = set_operands(&b.lhs);
            operands.extend(set_operands(&b.rhs));
            operands
        }
        other => vec![other.clone()],
    }
}

/// The left side of the top-level threshold comparison (`>`, `<`, `==`, `!=`, `>=`, `<=`),
/// or `expr` itself if it has none.
pub(crate) fn strip_comparison(expr: &Expr) -> &Expr {
    match expr {
        Expr::Binary(b) if b.op.is_comparison_operator() => strip_comparison(&b.lhs),
        other => other,
    }
}

/// The metric names of every vector selector in `expr` (ranges included).
pub(crate) fn metric_names(expr: &Expr) -> BTreeSet<String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = std::convert::Infallible;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
            let selector = match expr {
                Expr::VectorSelector(vs) => vs,
                Expr::MatrixSelector(ms) => &ms.vs,
                _ => return Ok(true),
            };
            self.0.extend(selector.name.clone());
            Ok(true)
        }
    }
    let mut names = Names(BTreeSet::new());
    let Ok(_) = walk_expr(&mut names, expr);
    names.0
}

#[test]
fn promql_helpers_read_alert_expressions() {
    let e = parse("sum by (job, instance) (x_total) > 0\nunless on (job, instance)\nsum by (job) (changes(y[10m])) > 0");
    let parts = set_operands(&e);
    assert_eq!(parts.len(), 2);
    assert_eq!(
        strip_comparison(&parts[0]).to_string(),
        "sum by (job, instance) (x_total)"
    );
    assert_eq!(
        strip_comparison(&parts[1]).to_string(),
        "sum by (job) (changes(y[10m]))"
    );
    assert_eq!(
        strip_comparison(&parse(r#"up{job="a>b"} == 0"#)).to_string(),
        r#"up{job="a>b"}"#
    );
    assert_eq!(set_operands(&parse("a_total / b_total > 0.01")).len(), 1);
    assert_eq!(
        set_operands(&parse("random_orders"))
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>(),
        vec!["random_orders".to_string()]
    );
    let names = metric_names(&parse(
        r#"histogram_quantile(0.99, sum by (le) (rate(a_bucket{instance=~"$i"}[5m]))) and on (job) b"#,
    ));
    assert_eq!(
        names,
        ["a_bucket", "b"].iter().map(|s| s.to_string()).collect()
    );
}
