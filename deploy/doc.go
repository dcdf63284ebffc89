// Package deploy holds the Kubernetes manifests of modelfs (the node
// DaemonSet, a credentials Secret example and an application example) and
// the image's Dockerfile. Its tests parse every manifest and check the
// properties the mount depends on: privilege, /dev/fuse, mount propagation,
// memory sized from the cache, probes, shutdown and credentials.
package deploy
