// Package charttest checks the Helm chart (deploy/helm/outbox-relay): it
// lints and renders it with Helm's own packages, decodes every object
// strictly into the Kubernetes API types, and compares it with the plain
// manifests of deploy/kubernetes.
package charttest
