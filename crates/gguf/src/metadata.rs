//! Typed GGUF metadata: the key/value header that describes the architecture, tokenizer and chat
//! template. Getters convert between integer widths because writers disagree on them (a count may
//! be stored as u32 by one converter and u64 by another).

use std::collections::HashMap;

use crate::{Error, Result};

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A homogeneous metadata array.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// Whether the array is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "array of u8",
            Array::I8(_) => "array of i8",
            Array::U16(_) => "array of u16",
            Array::I16(_) => "array of i16",
            Array::U32(_) => "array of u32",
            Array::I32(_) => "array of i32",
            Array::U64(_) => "array of u64",
            Array::I64(_) => "array of i64",
            Array::F32(_) => "array of f32",
            Array::F64(_) => "array of f64",
            Array::Bool(_) => "array of bool",
            Array::String(_) => "array of string",
            Array::Array(_) => "array of array",
        }
    }
}

impl Value {
    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(a) => a.type_name(),
        }
    }

    /// The value as a signed 128-bit integer, if it is an integer of any width.
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
}

/// The metadata of a GGUF file, in file order with a key index.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub(crate) fn insert(&mut self, key: String, value: Value) -> Result<()> {
        if self.index.contains_key(&key) {
            return Err(Error::Duplicate {
                what: "metadata key",
                name: key,
            });
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// All entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value under `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| Error::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, expected: &'static str, found: &Value) -> Error {
        Error::WrongType {
            key: key.to_string(),
            expected,
            found: found.type_name(),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            other => Err(Self::wrong(key, "string", other)),
        }
    }

    /// An integer value of any stored width that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        v.as_integer()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| Self::wrong(key, "integer fitting in u32", v))
    }

    /// An integer value of any stored width that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_integer()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| Self::wrong(key, "integer fitting in u64", v))
    }

    /// A floating-point value (f32 or f64, narrowed to f32).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            other => Err(Self::wrong(key, "float", other)),
        }
    }

    /// A boolean value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(v) => Ok(*v),
            other => Err(Self::wrong(key, "bool", other)),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v),
            other => Err(Self::wrong(key, "array of string", other)),
        }
    }

    /// An array of i32.
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32]> {
        match self.require(key)? {
            Value::Array(Array::I32(v)) => Ok(v),
            other => Err(Self::wrong(key, "array of i32", other)),
        }
    }

    /// An array of f32.
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32]> {
        match self.require(key)? {
            Value::Array(Array::F32(v)) => Ok(v),
            other => Err(Self::wrong(key, "array of f32", other)),
        }
    }
}
