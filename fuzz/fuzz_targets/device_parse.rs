//! Fuzzes the device-name parser: any input must parse or fail cleanly, and whatever
//! parses must print to a string that parses back to the same spec.
//!
//! Run by hand (needs nightly): `cargo +nightly fuzz run device_parse` from the repository
//! root. Not part of CI.

#![no_main]

use _core::device::{parse, tpu_device_map, DeviceSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    match parse(input) {
        Ok(spec) => {
            let printed = spec.to_string();
            assert_eq!(
                parse(&printed),
                Ok(spec),
                "{input:?} printed as {printed:?}"
            );
            assert_eq!(DeviceSpec::from(spec).render(), printed);
        }
        Err(err) => {
            let message = err.to_string();
            assert!(message.contains(&format!("{input:?}")), "{message}");
        }
    }
    let _ = tpu_device_map(input.lines());
});
