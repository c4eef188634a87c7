//! The channel count: channels added while windows or random loss hold the others back, kept
//! only if they pay, retired if they bring nothing.

use super::{Action, Growth, OnlineTuner};
use crate::tuning::estimate::PathEstimator;

/// Share of busy time a channel is held back by a window before more channels may help.
const WINDOW_LIMITED: f64 = 0.3;

/// Shortest time between two changes of the channel count, seconds.
const EPOCH_MIN_S: f64 = 2.0;

/// An added channel must bring at least this share of an average channel's goodput.
const MIN_GAIN_PER_CHANNEL: f64 = 0.5;

/// Added channels that each brought less than this share of an average channel's goodput
/// brought nothing beyond the noise of two seconds' goodput (for two added to four, 5 % of
/// the total): they are retired. Between this and [`MIN_GAIN_PER_CHANNEL`] they stay (what
/// they brought is kept) and the count freezes. On lab path (e), two added to four brought
/// 6 % twice (817 to 865 and 828 to 879 Mbit/s), which retiring them would give up, and 3 %
/// once (retired).
const MIN_GAIN_TO_KEEP: f64 = 0.1;

impl OnlineTuner {
    /// The channel count, once an epoch (at least [`EPOCH_MIN_S`], 16 rounds): while windows
    /// or random loss hold the channels and the goodput is short of the rate, the count
    /// grows by half; an addition is judged over the next epoch, kept, frozen or retired.
    pub(super) fn control_count(
        &mut self,
        est: &PathEstimator,
        t: f64,
        round: f64,
        since_start: f64,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let epoch = EPOCH_MIN_S.max(16.0 * round);
        if t - self.last_change < epoch {
            return actions;
        }
        // Goodput before and after a change of the count is read over the epoch's second
        // half: channels started at its beginning spend the first ramping up. In a simulated
        // 120 ms path, four channels released by the meter took a second to fill their
        // windows; read over the whole epoch they moved 639 Mbit/s where they carried 800,
        // and two channels added then looked as if they paid.
        let steady = epoch / 2.0;
        // Through random loss, channels added reach their share slowly and the goodput is
        // noisy: their gain is judged over the epoch after the one they started in. Judged
        // over the first, two channels added to four at 60 ms and 0.1 % loss showed +2 %,
        // the count froze at 6, and a copy moved 44–52 Mbit/s where 19 channels moved 124.
        if self.growth.is_some() && self.report.lossy && t - self.last_change < 2.0 * epoch {
            return actions;
        }
        if let Some(g) = self.growth.take() {
            let after = est.goodput(steady).unwrap_or(0.0);
            let per_added = (after - g.before) / g.added as f64;
            let per_channel = g.before / g.channels_before as f64;
            let paid = per_added >= MIN_GAIN_PER_CHANNEL * per_channel;
            let useless = per_added < MIN_GAIN_TO_KEEP * per_channel;
            self.decide(
                since_start,
                format!(
                    "{} channels: {:.1} Mbit/s, was {:.1} with {}: {}",
                    self.channels,
                    after * 8e-6,
                    g.before * 8e-6,
                    g.channels_before,
                    if paid {
                        "the added channels paid".to_string()
                    } else if useless {
                        format!(
                            "the added channels brought nothing: retiring them, back to {}",
                            g.channels_before
                        )
                    } else {
                        "the added channels did not pay, the count stays".to_string()
                    }
                ),
            );
            if useless {
                actions.extend(self.retire(g.channels_before));
            }
            self.frozen = !paid;
            self.last_change = t;
            return actions;
        }
        if self.frozen || self.channels >= self.cfg.max_channels {
            return actions;
        }
        let Some(goodput) = est.goodput(steady) else {
            return actions;
        };
        let n = self.channels as usize;
        let limited = (0..n).map(|i| est.window_limited(i, epoch)).sum::<f64>() / n as f64;
        let short_of_rate = self
            .steady_total()
            .is_none_or(|total| goodput < 0.9 * total);
        let why = if limited > WINDOW_LIMITED {
            format!(
                "channels held back by a window {:.0} % of the time",
                limited * 100.0
            )
        } else if self.report.lossy {
            "random loss keeps each channel's window small".into()
        } else {
            return actions;
        };
        if !short_of_rate {
            return actions;
        }
        let add = (self.channels / 2)
            .max(1)
            .min(self.cfg.max_channels - self.channels);
        self.growth = Some(Growth {
            before: goodput,
            channels_before: self.channels,
            added: add,
        });
        self.channels += add;
        self.report.channels = self.channels;
        self.last_change = t;
        self.decide(
            since_start,
            format!(
                "{why} at {:.1} Mbit/s: adding {add} channel(s) to {}",
                goodput * 8e-6,
                self.channels
            ),
        );
        actions.push(Action::AddChannels(add));
        if self.cfg.pace {
            actions.extend(self.pace_all());
        }
        actions
    }

    /// Back to the first `keep` channels: the others finish the block they carry and take
    /// no more, and the caps are shared among those left. Added channels that brought
    /// nothing still cost the hosts' cores and memory, and take the other traffic's share
    /// when the path is shared: on 50 Mbit/s × 40 ms, where four channels whose receive
    /// windows were all held filled the link, two more brought 0.4 of its 47.4 Mbit/s.
    fn retire(&mut self, keep: u16) -> Vec<Action> {
        self.channels = keep;
        self.report.channels = keep;
        let mut actions = vec![Action::Retire { keep }];
        if self.cfg.pace {
            actions.extend(self.pace_all());
        }
        actions
    }
}
