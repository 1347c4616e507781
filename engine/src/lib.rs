pub use kiln_functionalize as functionalize;
