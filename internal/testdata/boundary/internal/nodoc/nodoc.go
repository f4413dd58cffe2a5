package nodoc

// Name has a doc; the package has none.
const Name = "nodoc"
