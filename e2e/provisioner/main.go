// local-dir-provisioner: the e2e cluster's default StorageClass, for tests that follow a user's steps
// (the README's cluster quick start makes its claims from the default StorageClass). Each claim gets a
// folder under --root on the one real node, served as a `local` PersistentVolume: root's, mode 0755, as a
// freshly made filesystem is, and, unlike hostPath, a volume whose ownership the kubelet sets from the
// pods' fsGroup. Built on sig-storage-lib-external-provisioner, which does the watching and binding.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

type localDirs struct {
	root         string
	label, value string // the node label the volumes are pinned to
}

func (p *localDirs) Provision(
	_ context.Context, options controller.ProvisionOptions,
) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	path := filepath.Join(p.root, options.PVName)
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("folder for %s: %w", options.PVName, err)
	}
	if err := os.Chmod(path, 0o755); err != nil { // not the umask's
		return nil, controller.ProvisioningFinished, err
	}
	reclaim := v1.PersistentVolumeReclaimDelete
	if options.StorageClass.ReclaimPolicy != nil {
		reclaim = *options.StorageClass.ReclaimPolicy
	}
	filesystem := v1.PersistentVolumeFilesystem
	pinned := v1.NodeSelectorRequirement{Key: p.label, Operator: v1.NodeSelectorOpIn, Values: []string{p.value}}
	volume := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: options.PVName},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: reclaim,
			AccessModes:                   options.PVC.Spec.AccessModes,
			Capacity:                      v1.ResourceList{v1.ResourceStorage: options.PVC.Spec.Resources.Requests[v1.ResourceStorage]},
			VolumeMode:                    &filesystem,
			PersistentVolumeSource:        v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: path}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{
				NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{pinned}}},
			}},
		},
	}
	klog.Infof("provisioned %s for %s/%s at %s", options.PVName, options.PVC.Namespace, options.PVC.Name, path)
	return volume, controller.ProvisioningFinished, nil
}

func (p *localDirs) Delete(_ context.Context, volume *v1.PersistentVolume) error {
	local := volume.Spec.Local
	if local == nil || filepath.Dir(local.Path) != p.root {
		return &controller.IgnoredError{Reason: "not a folder of this provisioner"}
	}
	klog.Infof("deleting %s: %s", volume.Name, local.Path)
	return os.RemoveAll(local.Path)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the cluster's kubeconfig")
	name := flag.String("name", "rljob.e2e/local-dir", "the provisioner name StorageClasses give")
	root := flag.String("root", "", "the folder the volumes' folders are made in")
	node := flag.String("node-label", "rljob.io/e2e-node=real", "label=value of the node the volumes are on")
	klog.InitFlags(nil)
	flag.Parse()
	label, value, found := strings.Cut(*node, "=")
	if *kubeconfig == "" || *root == "" || !found {
		fmt.Fprintln(os.Stderr, "usage: local-dir-provisioner --kubeconfig FILE --root DIR [--node-label KEY=VALUE]")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig %s: %v", *kubeconfig, err)
	}
	absolute, err := filepath.Abs(*root)
	if err != nil {
		klog.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	provisioner := &localDirs{root: absolute, label: label, value: value}
	client := kubernetes.NewForConfigOrDie(config)
	controller.NewProvisionController(ctx, client, *name, provisioner, controller.LeaderElection(false)).Run(ctx)
}
