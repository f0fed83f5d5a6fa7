// Package layout holds the tests of the module's shape: the allowed import graph between
// its packages (layout_test.go, DEVELOPERS.md "Layers") and the public API's names
// (api_test.go: a program using a public package never needs an internal one), and the tree's
// hygiene (tree_test.go: no issue numbers, dates, session talk or build-machine paths in any
// tracked file).
package layout
