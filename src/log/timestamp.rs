//! The time an event is stamped with, `2026-11-25T17:30:53.123456Z` (RFC 3339 in UTC, to
//! the microsecond, as chrono writes it), written into a fixed buffer: every event of a
//! run takes one, so it allocates nothing and skips the general formatter.

use std::time::{SystemTime, UNIX_EPOCH};

/// The length of a stamp of the years 0000–9999.
const LEN: usize = 27;
/// Room for chrono's stamps of every year it knows (`+262143-…`).
const ROOM: usize = 32;

/// A stamp, ready to be written.
#[derive(Clone, Copy)]
pub(crate) struct Timestamp {
    bytes: [u8; ROOM],
    len: u8,
}

impl Timestamp {
    pub fn now() -> Timestamp {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(since) => Timestamp::at(since.as_secs() as i64, since.subsec_micros()),
            // A clock set before 1970: the general formatter knows how to write it.
            Err(_) => Timestamp::slow(chrono::Utc::now()),
        }
    }

    /// A stamp as another line had it, kept as written; `None` when it does not fit.
    pub fn of_text(text: &str) -> Option<Timestamp> {
        let n = text.len();
        if n == 0 || n > ROOM || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        let mut bytes = [0u8; ROOM];
        bytes[..n].copy_from_slice(text.as_bytes());
        Some(Timestamp { bytes, len: n as u8 })
    }

    /// The stamp of `secs` seconds and `micros` microseconds after the Unix epoch.
    fn at(secs: i64, micros: u32) -> Timestamp {
        let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let (year, month, day) = civil_from_days(days);
        if !(0..=9999).contains(&year) {
            let time = chrono::DateTime::from_timestamp(secs, micros * 1000).unwrap_or_default();
            return Timestamp::slow(time);
        }
        let mut bytes = [0u8; ROOM];
        bytes[..LEN].copy_from_slice(b"0000-00-00T00:00:00.000000Z");
        let mut put = |at: usize, width: usize, mut value: u32| {
            for i in (at..at + width).rev() {
                bytes[i] = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        put(0, 4, year as u32);
        put(5, 2, month);
        put(8, 2, day);
        put(11, 2, (of_day / 3600) as u32);
        put(14, 2, (of_day / 60 % 60) as u32);
        put(17, 2, (of_day % 60) as u32);
        put(20, 6, micros);
        Timestamp { bytes, len: LEN as u8 }
    }

    /// chrono's own formatting, for the years the fixed layout cannot hold.
    fn slow(time: chrono::DateTime<chrono::Utc>) -> Timestamp {
        let text = time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let mut bytes = [0u8; ROOM];
        let n = text.len().min(ROOM);
        bytes[..n].copy_from_slice(&text.as_bytes()[..n]);
        Timestamp { bytes, len: n as u8 }
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII digits and separators are ever written.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_reads_as_chronos_to_the_microsecond() {
        let moments = [
            (0, 0),
            (951_782_400, 999_999),     // 2000-02-29
            (1_078_012_799, 1),         // 2004-02-29T23:59:59
            (1_798_761_599, 500_000),   // 2026-12-31T23:59:59
            (1_796_059_853, 123_456),   // 2026-11-30
            (4_107_542_400, 7),         // 2100-03-01, not a leap year
            (253_402_300_799, 999_999), // 9999-12-31T23:59:59
            (253_402_300_800, 0),       // 10000-01-01: the general formatter
            (-62_167_219_201, 0),       // the year -1: the general formatter
            (-1, 0),                    // 1969
        ];
        let chronos = |secs, micros: u32| {
            let time = chrono::DateTime::from_timestamp(secs, micros * 1000).unwrap();
            time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        };
        for (secs, micros) in moments {
            assert_eq!(Timestamp::at(secs, micros).as_str(), chronos(secs, micros), "{secs}.{micros:06}");
        }
        // A day in every three years or so, from the year 0 to 10000.
        for day in (-719_528..2_932_897).step_by(997) {
            let secs = day * 86_400 + 45_296;
            assert_eq!(Timestamp::at(secs, 42).as_str(), chronos(secs, 42), "day {day}");
        }
    }
}
