// Package layers keeps the module's packages in their layers, as
// ARCHITECTURE.md draws them: its test fails when a package imports one
// above its own layer, when a sink imports more of the module than the
// sink contract, or when a package has no layer.
package layers
