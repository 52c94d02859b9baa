//! Test-scale dsv41 checkpoint generator.
