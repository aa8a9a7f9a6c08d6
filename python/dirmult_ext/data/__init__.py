"""Count data: sparse count matrices (``sparse_counts``), file formats
(``io``, ``h5ad``), the bundled data sets (``datasets``), the streaming of
host rows to a device (``row_stream``) and the fit's thread policy
(``threads``)."""
