"""The lazy layers, one file per family of torch.nn layers (nothing to re-export here: the
package's ``__init__`` re-exports each layer)."""
