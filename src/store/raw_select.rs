//! A `SELECT` stepped through SQLite's C interface, for readers that take
//! every column of tens of thousands of rows at a time (the export stage).
//! rusqlite's path per column (bounds check, type lookup, `FromSql`,
//! `ValueRef`) was about a fifth of such a read, measured in
//! `cargo bench --bench export`. The checks stay: a column holding the
//! wrong type, an integer out of range or text that is not UTF-8 is the
//! same `rusqlite::Error` rusqlite gives, naming the column (or its index).
//!
//! A [`RawSelect`] borrows its connection, so it cannot outlive it nor move
//! to another thread (neither `Send` nor `Sync`), and it is finalized when
//! dropped.

use super::rows::Columns;
use rusqlite::types::Type;
use rusqlite::{ffi, Connection, Error, Result};
use std::ffi::{c_int, CStr};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

/// One prepared statement of `conn`, bound and stepped by hand.
pub struct RawSelect<'c> {
    db: NonNull<ffi::sqlite3>,
    stmt: NonNull<ffi::sqlite3_stmt>,
    /// Holds the connection borrowed (it must outlive the statement) and
    /// makes this type neither `Send` nor `Sync`, as the connection is
    /// opened without SQLite's own mutex.
    _conn: PhantomData<&'c Connection>,
}

impl<'c> RawSelect<'c> {
    /// Prepares `sql` (one statement) on `conn`.
    pub fn prepare(conn: &'c Connection, sql: &str) -> Result<RawSelect<'c>> {
        // SAFETY: the handle is used only while `conn` is borrowed (the
        // PhantomData above), on this thread.
        let db = unsafe { conn.handle() };
        let db = NonNull::new(db).ok_or(Error::InvalidQuery)?;
        let len = c_int::try_from(sql.len()).map_err(|_| Error::InvalidQuery)?;
        let mut stmt = ptr::null_mut();
        // SAFETY: `sql` is valid for `len` bytes (SQLite does not need a
        // terminating NUL when given the length); `stmt` is a valid out
        // pointer; `db` is an open connection.
        let rc = unsafe {
            ffi::sqlite3_prepare_v2(
                db.as_ptr(),
                sql.as_ptr().cast(),
                len,
                &mut stmt,
                ptr::null_mut(),
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(last_error(db, rc));
        }
        // A string of only whitespace or comments prepares to no statement.
        let stmt = NonNull::new(stmt).ok_or(Error::InvalidQuery)?;
        Ok(RawSelect {
            db,
            stmt,
            _conn: PhantomData,
        })
    }

    /// Binds the 1-based parameter `index` to `value`.
    pub fn bind_i64(&mut self, index: c_int, value: i64) -> Result<()> {
        // SAFETY: the statement is live and not being stepped by anyone
        // else (`&mut self`); SQLite checks `index` itself.
        let rc = unsafe { ffi::sqlite3_bind_int64(self.stmt.as_ptr(), index, value) };
        if rc != ffi::SQLITE_OK {
            return Err(last_error(self.db, rc));
        }
        Ok(())
    }

    /// Makes the statement ready to run again (bindings are kept), ending
    /// the read transaction it may still hold. An error the last step
    /// already returned is not returned again.
    pub fn reset(&mut self) {
        // SAFETY: the statement is live and not being stepped by anyone
        // else (`&mut self`); the values of its last row end here.
        unsafe { ffi::sqlite3_reset(self.stmt.as_ptr()) };
    }

    /// Steps to the next row: true if there is one. Values borrowed from
    /// the previous row end here (`&mut self`).
    pub fn step(&mut self) -> Result<bool> {
        // SAFETY: the statement is live and prepared on `self.db`.
        match unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) } {
            ffi::SQLITE_ROW => Ok(true),
            ffi::SQLITE_DONE => Ok(false),
            rc => Err(last_error(self.db, rc)),
        }
    }

    /// Column `i` of the current row as SQLite holds it, to read its type
    /// and value from without looking the column up again for each (every
    /// `sqlite3_column_*` call looks it up and takes and leaves the
    /// connection's mutex: about a tenth of an export's read, measured).
    /// An index out of range gives SQLite's NULL value, which the callers
    /// turn into an error or None.
    fn value(&self, i: usize) -> Result<*mut ffi::sqlite3_value> {
        // SAFETY: the statement is live. The value is SQLite's
        // "unprotected" kind, which may be read with `sqlite3_value_*`
        // where no other thread can use the connection meanwhile: this one
        // is opened without SQLite's mutex and used by one thread (the
        // statement is neither Send nor Sync). It stays valid until the
        // next step, reset or finalize, none of which can happen while
        // `&self` is held.
        let v = unsafe { ffi::sqlite3_column_value(self.stmt.as_ptr(), i as c_int) };
        if v.is_null() {
            // Not done by SQLite today (a static NULL value stands in for
            // a missing column); an error rather than a dereference.
            return Err(Error::SqliteFailure(
                ffi::Error::new(ffi::SQLITE_MISUSE),
                Some(format!("column {i}: no value")),
            ));
        }
        Ok(v)
    }

    fn mismatch(&self, i: usize, found: c_int) -> Error {
        let ty = match found {
            ffi::SQLITE_INTEGER => Type::Integer,
            ffi::SQLITE_FLOAT => Type::Real,
            ffi::SQLITE_TEXT => Type::Text,
            ffi::SQLITE_BLOB => Type::Blob,
            _ => Type::Null,
        };
        Error::InvalidColumnType(i, self.column_name(i), ty)
    }

    fn column_name(&self, i: usize) -> String {
        // SAFETY: the statement is live; the name (or NULL, for an index
        // out of range) is valid until the statement is finalized, and is
        // copied at once.
        unsafe {
            let p = ffi::sqlite3_column_name(self.stmt.as_ptr(), i as c_int);
            if p.is_null() {
                "?".to_string()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }
}

impl<'a> Columns<'a> for &'a RawSelect<'_> {
    fn int(&self, i: usize) -> Result<i64> {
        let v = self.value(i)?;
        // SAFETY: `v` is column `i` of the current row, readable while
        // `&self` is held (see `value`).
        match unsafe { ffi::sqlite3_value_type(v) } {
            // SAFETY: as above; an integer value read as one.
            ffi::SQLITE_INTEGER => Ok(unsafe { ffi::sqlite3_value_int64(v) }),
            other => Err(self.mismatch(i, other)),
        }
    }

    fn text(&self, i: usize) -> Result<Option<&'a str>> {
        let v = self.value(i)?;
        // SAFETY: as in `int`.
        match unsafe { ffi::sqlite3_value_type(v) } {
            ffi::SQLITE_NULL => Ok(None),
            ffi::SQLITE_TEXT => {
                // SAFETY: `v` as in `int`. The text pointer is fetched
                // before its length, as SQLite asks; both stay valid until
                // the next step, reset or finalize, none of which can
                // happen while `&'a self` is held. A NULL pointer (out of
                // memory) is an error, not a slice.
                let bytes = unsafe {
                    let p = ffi::sqlite3_value_text(v);
                    if p.is_null() {
                        return Err(Error::SqliteFailure(
                            ffi::Error::new(ffi::SQLITE_NOMEM),
                            Some(format!("column {i}: no memory for its text")),
                        ));
                    }
                    let n = ffi::sqlite3_value_bytes(v);
                    std::slice::from_raw_parts(p, n.max(0) as usize)
                };
                std::str::from_utf8(bytes)
                    .map(Some)
                    .map_err(|e| Error::Utf8Error(i, e))
            }
            other => Err(self.mismatch(i, other)),
        }
    }

    fn name(&self, i: usize) -> String {
        self.column_name(i)
    }
}

impl Drop for RawSelect<'_> {
    fn drop(&mut self) {
        // SAFETY: the statement was prepared on a connection that is still
        // open (borrowed for 'c) and is finalized exactly once, here.
        unsafe {
            ffi::sqlite3_finalize(self.stmt.as_ptr());
        }
    }
}

/// The connection's error for the failed call that returned `rc`.
fn last_error(db: NonNull<ffi::sqlite3>, rc: c_int) -> Error {
    // SAFETY: `db` is open; the message is copied before any other call on
    // this connection (which is used by one thread only).
    let message = unsafe {
        let p = ffi::sqlite3_errmsg(db.as_ptr());
        (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
    };
    Error::SqliteFailure(ffi::Error::new(rc), message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rows::{EventView, EVENT_COLUMNS};

    /// A table shaped like `events` (no constraints, so that wrong types
    /// can be stored) with one good row and rows each wrong in one column.
    fn table() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&format!(
            "CREATE TABLE t ({EVENT_COLUMNS});
             INSERT INTO t VALUES (1, 2, 3, 4, 5, 6, 7, 6, 'p', 'n', 'héllo', NULL);
             INSERT INTO t VALUES (1, 2, 3, 4, 5, 6, 7, 6, 'p', 'n', 'm', '{{\"k\":1}}');
             INSERT INTO t VALUES (1, 'x', 3, 4, 5, 6, 7, 6, 'p', 'n', 'm', NULL);
             INSERT INTO t VALUES (1, 2, 3, 4, -5, 6, 7, 6, 'p', 'n', 'm', NULL);
             INSERT INTO t VALUES (1, 2, 3, 4, 5, 6, 7, 300, 'p', 'n', 'm', NULL);
             INSERT INTO t VALUES (1, 2, 3, 4, 5, 6, 7, 6, NULL, 'n', 'm', NULL);
             INSERT INTO t VALUES (1, 2, 3, 4, 5, 6, 7, 6, 'p', 'n', CAST(x'ff00' AS TEXT), NULL);
             INSERT INTO t VALUES (1.5, 2, 3, 4, 5, 6, 7, 6, 'p', 'n', 'm', NULL);
             INSERT INTO t VALUES (1, 2, 3, 4, 5, 6, 7, 6, 'p', 'n', x'00', NULL);"
        ))
        .unwrap();
        conn
    }

    /// Each row as rusqlite's rows read it and as `RawSelect` does: the
    /// same values, the same errors.
    #[test]
    fn reads_and_refuses_exactly_what_rusqlite_rows_do() {
        let conn = table();
        let sql = format!("SELECT {EVENT_COLUMNS} FROM t WHERE rowid >= ?1 ORDER BY rowid");
        let mut stmt = conn.prepare(&sql).unwrap();
        let by_rows: Vec<String> = stmt
            .query_map([1i64], |r| Ok(format!("{:?}", EventView::from_row(r))))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let mut raw = RawSelect::prepare(&conn, &sql).unwrap();
        raw.bind_i64(1, 1).unwrap();
        let mut by_raw = Vec::new();
        while raw.step().unwrap() {
            by_raw.push(format!("{:?}", EventView::from_columns(&raw)));
        }
        assert_eq!(by_raw, by_rows);
        assert_eq!(by_raw.len(), 9);
        assert!(by_raw[0].starts_with("Ok(") && by_raw[0].contains("héllo"));
        assert!(by_raw[1].contains(r#"Some("{\"k\":1}")"#), "{}", by_raw[1]);
        let wrong = [
            (2, "InvalidColumnType(1, \"cpu\", Text)"),
            (3, "IntegralValueOutOfRange(4, -5)"),
            (4, "IntegralValueOutOfRange(7, 300)"),
            (5, "InvalidColumnType(8, \"provider\", Null)"),
            (6, "Utf8Error(10,"),
            (7, "InvalidColumnType(0, \"ts\", Real)"),
            (8, "InvalidColumnType(10, \"message\", Blob)"),
        ];
        for (row, err) in wrong {
            assert!(by_raw[row].contains(err), "row {row}: {}", by_raw[row]);
        }
        // Binding restarts nothing by itself; a fresh statement reads from
        // where it is told.
        let mut raw = RawSelect::prepare(&conn, &sql).unwrap();
        raw.bind_i64(1, 9).unwrap();
        assert!(raw.step().unwrap());
        assert!(!raw.step().unwrap());
    }

    #[test]
    fn errors_name_what_sqlite_said() {
        let conn = table();
        let err = RawSelect::prepare(&conn, "SELECT nope FROM t")
            .err()
            .unwrap();
        assert!(err.to_string().contains("no such column: nope"), "{err}");
        assert!(matches!(
            RawSelect::prepare(&conn, " -- nothing"),
            Err(Error::InvalidQuery)
        ));
        let mut raw = RawSelect::prepare(&conn, "SELECT ?1").unwrap();
        let err = raw.bind_i64(2, 0).unwrap_err();
        assert!(
            err.to_string().contains("column index out of range"),
            "{err}"
        );
    }
}
