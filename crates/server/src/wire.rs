//! Deserializers for the wire's "a string, or ..." fields (`content`,
//! `system`, `input`, `tool_choice`).
//!
//! Contract: serde's untagged enums try each variant on a buffered copy
//! and, when none fits, say only "data did not match any variant", losing
//! which field of which block was wrong. These read the string form
//! directly and the other form through the same deserializer, so an error
//! inside a list or object keeps its path
//! (`messages[1].content[0].type`) for [`crate::protocol::parse`].
//!
//! Costs: none beyond the derived deserializers'.

/// Implements `Deserialize` for `$ty`, an enum of a string variant `$text`
/// and a list variant `$list` of `$item`s (`$what` names the list form in
/// "expected a string or ...").
macro_rules! string_or_list {
    ($ty:ident, $text:ident, $list:ident, $item:ty, $what:literal) => {
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        write!(f, "a string or {}", $what)
                    }
                    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<$ty, E> {
                        Ok($ty::$text(s.to_owned()))
                    }
                    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<$ty, E> {
                        Ok($ty::$text(s))
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(
                        self,
                        seq: A,
                    ) -> Result<$ty, A::Error> {
                        let items = <Vec<$item> as serde::Deserialize>::deserialize(
                            serde::de::value::SeqAccessDeserializer::new(seq),
                        )?;
                        Ok($ty::$list(items))
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

/// Implements `Deserialize` for `$ty`, an enum of a string variant `$text`
/// and an object variant `$obj` of type `$inner`.
macro_rules! string_or_object {
    ($ty:ident, $text:ident, $obj:ident, $inner:ty, $what:literal) => {
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        write!(f, "a string or {}", $what)
                    }
                    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<$ty, E> {
                        Ok($ty::$text(s.to_owned()))
                    }
                    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<$ty, E> {
                        Ok($ty::$text(s))
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        map: A,
                    ) -> Result<$ty, A::Error> {
                        let inner = <$inner as serde::Deserialize>::deserialize(
                            serde::de::value::MapAccessDeserializer::new(map),
                        )?;
                        Ok($ty::$obj(inner))
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

pub(crate) use {string_or_list, string_or_object};
