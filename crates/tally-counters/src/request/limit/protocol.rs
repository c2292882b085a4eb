//! The limit script's request protocol, both sides in one place: after the request id and the
//! mode, each policy (and each reserving policy's index entry) is [`ARGS_PER_POLICY`] values in
//! [`Arg`] order, the kind of ask one of [`AskKind`]'s codes. `lua/limit.lua` reads them as
//! `ARGV[b + n]`; the tests below read the Lua sources and fail when the two sides disagree (a
//! stride, an offset, or a kind code one side does not know).

/// Values per policy after the request id and the mode.
pub(super) const ARGS_PER_POLICY: usize = 6;

/// A policy's values, in order; `n` in the script's `ARGV[b + n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arg {
    /// The algorithm's code ([`super::Algorithm::code`]; 5: a reservation index entry).
    Algorithm = 1,
    Limit = 2,
    WindowMs = 3,
    /// GCRA's burst (the limit for the other algorithms).
    Burst = 4,
    Kind = 5,
    /// Units asked; 0 checks without recording.
    Cost = 6,
}

/// What is asked of one policy: how the script decides it and whether it records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AskKind {
    /// Denies when out of room.
    Enforce,
    /// Decided and recorded, never denies (`shadow`).
    Shadow,
    /// A charge for what was used: always recorded, never denied.
    Usage,
    /// A quota: out of room, it denies only with every other quota of the call.
    Quota,
    /// A quota charged for what was used.
    QuotaUsage,
    /// A quota in shadow: always has room.
    QuotaShadow,
    /// Reserve (`reserve.lua`): decided against settled usage plus live reservations.
    Reserve,
    /// Settle a reservation (`reserve.lua`).
    Settle,
    /// Give units back (`refund.lua`).
    Refund,
}

impl AskKind {
    /// Every kind, in code order.
    #[cfg(test)]
    pub(super) const ALL: [AskKind; 9] = [
        AskKind::Enforce,
        AskKind::Shadow,
        AskKind::Usage,
        AskKind::Quota,
        AskKind::QuotaUsage,
        AskKind::QuotaShadow,
        AskKind::Reserve,
        AskKind::Settle,
        AskKind::Refund,
    ];

    /// The code the script compares (`kind == '3'`).
    pub(super) fn code(self) -> &'static str {
        match self {
            AskKind::Enforce => "0",
            AskKind::Shadow => "1",
            AskKind::Usage => "2",
            AskKind::Quota => "3",
            AskKind::QuotaUsage => "4",
            AskKind::QuotaShadow => "5",
            AskKind::Reserve => "6",
            AskKind::Settle => "7",
            AskKind::Refund => "8",
        }
    }

    /// The kind of an ask: a refund, a reservation's phase, else by quota, shadow and usage
    /// (a shadow ask records what it is given, so usage changes nothing in shadow).
    pub(super) fn of(ask: AskFlags) -> AskKind {
        match ask {
            AskFlags { refund: true, .. } => AskKind::Refund,
            AskFlags {
                reserve: Some(true),
                ..
            } => AskKind::Reserve,
            AskFlags {
                reserve: Some(false),
                ..
            } => AskKind::Settle,
            AskFlags {
                quota: false,
                shadow: true,
                ..
            } => AskKind::Shadow,
            AskFlags {
                quota: false,
                usage: true,
                ..
            } => AskKind::Usage,
            AskFlags { quota: false, .. } => AskKind::Enforce,
            AskFlags { shadow: true, .. } => AskKind::QuotaShadow,
            AskFlags { usage: true, .. } => AskKind::QuotaUsage,
            AskFlags { .. } => AskKind::Quota,
        }
    }
}

/// The flags an ask's kind follows from.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AskFlags {
    pub(super) refund: bool,
    /// A reservation: `Some(true)` reserves, `Some(false)` settles.
    pub(super) reserve: Option<bool>,
    pub(super) quota: bool,
    pub(super) shadow: bool,
    pub(super) usage: bool,
}

/// One policy's values, pushed in [`Arg`] order.
pub(super) struct PolicyArgs {
    pub(super) algorithm: u8,
    pub(super) limit: u64,
    pub(super) window_ms: u64,
    pub(super) burst: u64,
    pub(super) kind: AskKind,
    pub(super) cost: u64,
}

impl Arg {
    /// The values of a policy, in the order they are sent.
    pub(super) const ORDER: [Arg; ARGS_PER_POLICY] = [
        Arg::Algorithm,
        Arg::Limit,
        Arg::WindowMs,
        Arg::Burst,
        Arg::Kind,
        Arg::Cost,
    ];
}

impl PolicyArgs {
    pub(super) fn push(&self, cmd: &mut redis::Cmd) {
        for arg in Arg::ORDER {
            match arg {
                Arg::Algorithm => cmd.arg(self.algorithm),
                Arg::Limit => cmd.arg(self.limit),
                Arg::WindowMs => cmd.arg(self.window_ms),
                Arg::Burst => cmd.arg(self.burst),
                Arg::Kind => cmd.arg(self.kind.code()),
                Arg::Cost => cmd.arg(self.cost),
            };
        }
    }
}

/// The algorithm code of a reservation index entry (`lua/reserve.lua`).
pub(super) const INDEX_ALGORITHM: u8 = 5;

/// A reserving policy's index entry (`lua/reserve.lua`), right after its policy's values and
/// in the same [`Arg`] order: where a policy has its limit, window and burst, the entry has its
/// own expiry, most extra units and request id; its policy's kind; no cost.
pub(super) struct IndexArgs<'a> {
    /// How long a reservation (and a settle's record) is kept, ms.
    pub(super) expiry_ms: u64,
    /// Most units a settle charges above its reservation.
    pub(super) max_extra: u64,
    /// The request's id ('' = none).
    pub(super) id: &'a str,
    /// Its policy's kind.
    pub(super) kind: AskKind,
}

impl IndexArgs<'_> {
    pub(super) fn push(&self, cmd: &mut redis::Cmd) {
        for arg in Arg::ORDER {
            match arg {
                Arg::Algorithm => cmd.arg(INDEX_ALGORITHM),
                Arg::Limit => cmd.arg(self.expiry_ms),
                Arg::WindowMs => cmd.arg(self.max_extra),
                Arg::Burst => cmd.arg(self.id),
                Arg::Kind => cmd.arg(self.kind.code()),
                Arg::Cost => cmd.arg(0),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sources of the limit script, as it is sent.
    fn lua() -> String {
        [
            include_str!("../lua/refund.lua"),
            include_str!("../lua/reserve.lua"),
            include_str!("../lua/limit.lua"),
        ]
        .concat()
    }

    /// The Lua code without its comments (a code named in a comment does not count as used).
    fn code(lua: &str) -> String {
        lua.lines()
            .map(|l| l.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every kind code the script compares: `kind == '3'`, `kind ~= '1'`, `ARGV[b + 5] == '8'`.
    fn compared_codes(code: &str) -> Vec<String> {
        let mut out = Vec::new();
        for op in ["== '", "~= '"] {
            for (at, _) in code.match_indices(op) {
                let left = code[..at].trim_end();
                let kind_read = left.ends_with("kind")
                    || left.ends_with(&format!("ARGV[b + {}]", Arg::Kind as usize));
                if kind_read {
                    let rest = &code[at + op.len()..];
                    out.push(rest[..rest.find('\'').expect("closing quote")].to_string());
                }
            }
        }
        out
    }

    #[test]
    fn the_script_reads_the_layout_the_callers_send() {
        let code = code(&lua());
        let stride = format!("(i - 1) * {ARGS_PER_POLICY}");
        assert!(code.contains(&stride), "limit.lua steps {stride}");
        assert!(
            code.contains(&format!("{ARGS_PER_POLICY} * n")),
            "the per-policy offsets follow {ARGS_PER_POLICY} values per policy"
        );
        for (arg, read) in [
            (Arg::Algorithm, "local algo, limit, window = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])"),
            (Arg::Kind, "local kind, given = ARGV[b + 5], tonumber(ARGV[b + 6])"),
        ] {
            assert!(code.contains(read), "{arg:?}: limit.lua reads `{read}`");
        }
        assert_eq!(
            [
                Arg::Algorithm,
                Arg::Limit,
                Arg::WindowMs,
                Arg::Burst,
                Arg::Kind,
                Arg::Cost
            ]
            .map(|a| a as usize),
            [1, 2, 3, 4, 5, 6]
        );
        assert_eq!(Arg::Cost as usize, ARGS_PER_POLICY);
        assert!(
            code.contains("tonumber(ARGV[b + 4])"),
            "limit.lua reads the burst"
        );
    }

    /// The values of `cmd`, as sent.
    fn sent(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "a cursor".into(),
            })
            .collect()
    }

    #[test]
    fn a_reserving_policy_and_its_index_entry_are_sent_where_the_script_reads_them() {
        let mut cmd = redis::Cmd::new();
        PolicyArgs {
            algorithm: 1,
            limit: 100,
            window_ms: 60_000,
            burst: 100,
            kind: AskKind::Settle,
            cost: 7,
        }
        .push(&mut cmd);
        IndexArgs {
            expiry_ms: 30_000,
            max_extra: 9,
            id: "req-1",
            kind: AskKind::Settle,
        }
        .push(&mut cmd);
        assert_eq!(
            sent(&cmd),
            ["1", "100", "60000", "100", "7", "7", "5", "30000", "9", "req-1", "7", "0"]
        );
        // The script reads the entry's values one stride past its policy's: the algorithm
        // code, then expiry, most extra units and request id where a policy has its limit,
        // window and burst.
        let code = code(&lua());
        let at = |arg: Arg| format!("ARGV[b + {}]", ARGS_PER_POLICY + arg as usize);
        assert!(code.contains(&format!("algo == {INDEX_ALGORITHM}")));
        for arg in [Arg::Limit, Arg::WindowMs, Arg::Burst] {
            assert!(
                code.contains(&at(arg)),
                "{arg:?}: the script reads {}",
                at(arg)
            );
        }
    }

    #[test]
    fn every_kind_the_script_compares_is_one_the_callers_send_and_back() {
        let compared = compared_codes(&code(&lua()));
        assert!(compared.len() >= 10, "kind comparisons found: {compared:?}");
        let sent: Vec<&str> = AskKind::ALL.iter().map(|k| k.code()).collect();
        for c in &compared {
            assert!(
                sent.contains(&c.as_str()),
                "the script compares kind '{c}', which no caller sends"
            );
        }
        // Every kind but enforcing (the script's default branch) is compared somewhere.
        for k in AskKind::ALL.iter().filter(|k| **k != AskKind::Enforce) {
            assert!(
                compared.iter().any(|c| c == k.code()),
                "{k:?} ('{}') is sent but the script never looks for it",
                k.code()
            );
        }
        let mut codes = sent.clone();
        codes.dedup();
        assert_eq!(codes.len(), AskKind::ALL.len(), "codes are distinct");
        // The header documents each code.
        let header = lua();
        for k in AskKind::ALL {
            assert!(
                header.contains(&format!("'{}'", k.code())),
                "{k:?} documented"
            );
        }
    }

    #[test]
    fn an_asks_flags_give_its_kind() {
        let ask = |quota, shadow, usage| AskFlags {
            quota,
            shadow,
            usage,
            ..AskFlags::default()
        };
        for (flags, kind) in [
            ((false, false, false), AskKind::Enforce),
            ((false, true, false), AskKind::Shadow),
            ((false, true, true), AskKind::Shadow),
            ((false, false, true), AskKind::Usage),
            ((true, false, false), AskKind::Quota),
            ((true, false, true), AskKind::QuotaUsage),
            ((true, true, false), AskKind::QuotaShadow),
            ((true, true, true), AskKind::QuotaShadow),
        ] {
            assert_eq!(
                AskKind::of(ask(flags.0, flags.1, flags.2)),
                kind,
                "{flags:?}"
            );
        }
        let refund = AskFlags {
            refund: true,
            quota: true,
            ..AskFlags::default()
        };
        assert_eq!(AskKind::of(refund), AskKind::Refund);
        for (reserve, kind) in [(true, AskKind::Reserve), (false, AskKind::Settle)] {
            let a = AskFlags {
                reserve: Some(reserve),
                shadow: true,
                ..AskFlags::default()
            };
            assert_eq!(AskKind::of(a), kind);
        }
    }
}
