"""The Transformer (encode / decode / decode_step), its attention, decoder caches, int8
layers, the label-smoothed loss, and the timing that chooses kernels on the machine at hand."""
