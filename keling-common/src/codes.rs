//! One definition per code set: [`code_set!`] writes, from one table of
//! `CONST = value, Variant, "name";` rows, the module of `u32` constants the probes
//! put in events and index maps with (plain consts: nothing else reaches the eBPF
//! object), and beside them the set as a type for the agent: an enum with
//! `from_raw` (a code the set does not define is `None`, never a guess), `code`,
//! the `name` every output prints, `from_name` and `ALL`.
//!
//! A code set's number, variant and name are written once, in its row; the agent's
//! decoder (`event/decode.rs`) and its names (`gpu/names.rs`) use the type.

/// Defines a code set: `pub mod $module` holding one `pub const $CONST: u32` per
/// row, and `enum $Enum` with one variant per row. Rows are listed in code order.
/// Items after the table go into the module too.
macro_rules! code_set {
    (
        $(#[$doc:meta])*
        pub mod $module:ident, enum $Enum:ident {
            $(
                $(#[$vdoc:meta])*
                $CONST:ident = $value:literal, $Variant:ident, $name:literal;
            )+
        }
        $($extra:item)*
    ) => {
        $(#[$doc])*
        pub mod $module {
            $(
                $(#[$vdoc])*
                pub const $CONST: u32 = $value;
            )+

            #[doc = concat!("The `", stringify!($module), "` codes as a type.")]
            #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
            pub enum $Enum {
                $(
                    $(#[$vdoc])*
                    $Variant,
                )+
            }

            impl $Enum {
                /// Every code of the set, in code order.
                pub const ALL: [Self; [$($CONST),+].len()] = [$(Self::$Variant),+];

                /// The code's meaning; `None` for a number the set does not define.
                pub const fn from_raw(code: u32) -> Option<Self> {
                    match code {
                        $($CONST => Some(Self::$Variant),)+
                        _ => None,
                    }
                }

                /// The number on the wire.
                pub const fn code(self) -> u32 {
                    match self {
                        $(Self::$Variant => $CONST,)+
                    }
                }

                /// The name every output (text, JSON lines, metrics, logs) prints.
                pub const fn name(self) -> &'static str {
                    match self {
                        $(Self::$Variant => $name,)+
                    }
                }

                /// The code named `name` (as [`Self::name`] prints it).
                pub fn from_name(name: &str) -> Option<Self> {
                    match name {
                        $($name => Some(Self::$Variant),)+
                        _ => None,
                    }
                }
            }

            $($extra)*
        }
    };
}

/// Defines a numbering set of the NVIDIA driver's ABI: `pub mod $module` holding
/// one `pub const $CONST: u32` per row (plain consts, usable from eBPF) and
/// `NAMES: &[(u32, &str)]`, each constant with the name NVIDIA gives it, in code
/// order (checked when the crate compiles: codes strictly increase, so each is
/// named once). Unlike [`code_set!`] no enum: the driver's numbers are open sets
/// (a number without a name is shown as a number). Items after the table (consts
/// that alias a row, sets of rows, helpers) go into the module too.
macro_rules! named_consts {
    (
        $(#[$doc:meta])*
        pub mod $module:ident {
            $(
                $(#[$vdoc:meta])*
                $CONST:ident = $value:literal, $name:literal;
            )+
        }
        $($extra:item)*
    ) => {
        $(#[$doc])*
        pub mod $module {
            $(
                $(#[$vdoc])*
                pub const $CONST: u32 = $value;
            )+

            /// Each constant of the set with its NVIDIA name, in code order (one
            /// name per code: checked when the crate compiles).
            pub const NAMES: &[(u32, &str)] = &[$(($CONST, $name)),+];

            const _: () = {
                let mut i = 1;
                while i < NAMES.len() {
                    assert!(NAMES[i - 1].0 < NAMES[i].0, "codes not in increasing order");
                    i += 1;
                }
            };

            /// The NVIDIA name of `code`, when the set names it.
            pub fn name(code: u32) -> Option<&'static str> {
                NAMES
                    .binary_search_by_key(&code, |&(c, _)| c)
                    .ok()
                    .map(|i| NAMES[i].1)
            }

            $($extra)*
        }
    };
}

/// For a set whose codes are `0..COUNT` (an index into a per-code array): `COUNT`,
/// and `NAMES` indexed by code. Checked when the crate compiles.
macro_rules! indexed_by_code {
    ($Enum:ident) => {
        /// Codes in the set: they are `0..COUNT`.
        pub const COUNT: u32 = $Enum::ALL.len() as u32;
        /// Each code's name, indexed by code.
        pub const NAMES: [&str; COUNT as usize] = {
            let mut names = [""; COUNT as usize];
            let mut i = 0;
            while i < names.len() {
                assert!($Enum::ALL[i].code() as usize == i, "codes are not 0..COUNT");
                names[i] = $Enum::ALL[i].name();
                i += 1;
            }
            names
        };
    };
}

#[cfg(test)]
mod tests {
    use crate::{
        active_cause::ActiveCause, mem_kind::MemKind, nvidia::ObjectKind, open_how::OpenHowCode,
        outcome::OutcomeCode, ref_how::RefHowCode, table_full::TableFull, teardown::TeardownReason,
        undecoded::UndecodedReason,
    };

    /// Each code of a set: its name leads back to it, its number leads back to it,
    /// and no other code of the set has its name or number.
    macro_rules! round_trips {
        ($Enum:ty) => {{
            for (i, c) in <$Enum>::ALL.iter().enumerate() {
                assert_eq!(<$Enum>::from_name(c.name()), Some(*c), "{c:?}");
                assert_eq!(<$Enum>::from_raw(c.code()), Some(*c), "{c:?}");
                assert!(!c.name().is_empty(), "{c:?}");
                for d in &<$Enum>::ALL[i + 1..] {
                    assert_ne!(c.name(), d.name(), "{c:?} and {d:?}");
                    assert!(c.code() < d.code(), "{c:?} before {d:?}: not in code order");
                }
            }
            assert_eq!(<$Enum>::from_name("no such name"), None);
        }};
    }

    #[test]
    fn every_code_name_round_trips() {
        round_trips!(MemKind);
        round_trips!(TeardownReason);
        round_trips!(OpenHowCode);
        round_trips!(RefHowCode);
        round_trips!(OutcomeCode);
        round_trips!(UndecodedReason);
        round_trips!(TableFull);
        round_trips!(ObjectKind);
        round_trips!(ActiveCause);
    }

    #[test]
    fn numbers_outside_a_set_are_refused() {
        assert_eq!(MemKind::from_raw(0), None);
        assert_eq!(MemKind::from_raw(4), None);
        assert_eq!(TeardownReason::from_raw(0), None);
        assert_eq!(OpenHowCode::from_raw(5), None);
        assert_eq!(RefHowCode::from_raw(0), None);
        assert_eq!(OutcomeCode::from_raw(3), None);
        assert_eq!(UndecodedReason::from_raw(crate::undecoded::COUNT), None);
        assert_eq!(TableFull::from_raw(crate::table_full::COUNT), None);
        assert_eq!(ObjectKind::from_raw(14), None);
        // The lenient reading the probes use maps what it does not know to Other.
        assert_eq!(ObjectKind::from_u32(14), ObjectKind::Other);
    }

    #[test]
    fn indexed_sets_name_each_index() {
        for (i, name) in crate::undecoded::NAMES.iter().enumerate() {
            assert_eq!(UndecodedReason::ALL[i].name(), *name);
        }
        for (i, name) in crate::table_full::NAMES.iter().enumerate() {
            assert_eq!(TableFull::ALL[i].name(), *name);
        }
    }
}
