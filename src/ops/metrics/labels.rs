//! The closed sets of label values. Each metric dimension is an enum, so cardinality is bounded
//! by construction, every series can be registered up front (dashboards see zeroes, not gaps),
//! and a call site cannot misspell a label. Each enum is declared with this macro beside the
//! metrics it labels.

macro_rules! labels {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The label text.
            pub fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }
    };
}

pub(super) use labels;
