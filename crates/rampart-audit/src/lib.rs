//! The proof: hash-chained, signed audit log (work in progress).
