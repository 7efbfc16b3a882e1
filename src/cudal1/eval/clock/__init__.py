"""The clock: how a call's time is paid, and how sure the speedup is (docs/sandbox.md, "How a call's time
is paid"). `measure` schedules the timed calls (calibration, paired calls in random order, nulls, checks of
outputs), `timing` turns the brackets into the time that counts, its interval and the clocks' checks, and
`runner_pairs` measures a candidate again in fresh runners. The bracket itself is drawn by the session
(`session.Session.call`), on the device by the helper (`inside.helper`) behind the gate (`shared.gate`)."""
