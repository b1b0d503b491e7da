// The programs inside the sandbox's own node images: the pod sandbox's pause
// process and a small multi-call test tool. Standard library only, built
// static (CGO_ENABLED=0), so each image is one binary in one layer.
module gpuspawner/sandbox/nodeimages

go 1.26.0
