"""``headrace verify``: source and target compared at one consistent position, by checksums each side
computes, down to the differing rows and columns."""
