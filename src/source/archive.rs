//! The archive source: replays an archive (laredo spec §8, rules C1–C5).
