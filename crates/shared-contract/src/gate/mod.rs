//! Event gates: "this event only once per period". See the submodules.
