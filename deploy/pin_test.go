package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/pkg/util"
	kusttypes "sigs.k8s.io/kustomize/api/types"
)

// TestDigestPinAsDocumented: the digest pin of docs/operations.md's
// Install step 2, `kustomize edit set image marksplit=…@sha256:…`, gives
// the pods the image reference the doc says they name. The argument is
// split as kustomize v5's `edit set image` does (util.SplitImageName), into
// the images entry it writes in place of the old one (newName, newTag,
// digest: what the argument leaves out is dropped), and deploy/ is rendered
// with it.
func TestDigestPinAsDocumented(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(string(data)), " ")
	m := regexp.MustCompile("`kustomize edit set image marksplit=(\\S+@sha256:…)`").FindStringSubmatch(doc)
	if m == nil {
		t.Fatal("docs/operations.md: no digest pin `kustomize edit set image marksplit=…@sha256:…`")
	}
	claim := regexp.MustCompile("The pods then name `(\\S+@sha256:…)`").FindStringSubmatch(doc)
	if claim == nil {
		t.Fatal("docs/operations.md: the digest pin says not what the pods name (`The pods then name …`)")
	}
	arg := strings.Replace(m[1], "sha256:…", testDigest, 1)
	name, tag, digest := util.SplitImageName(arg)
	entry := &kusttypes.Image{Name: "marksplit", NewName: name, NewTag: tag, Digest: digest}
	ds := kustomizedDaemonSet(t, kustomizeOpts{image: entry})
	want := strings.Replace(claim[1], "sha256:…", testDigest, 1)
	if got := ds.Spec.Template.Spec.Containers[0].Image; got != want {
		t.Errorf("kustomize edit set image marksplit=%s: the pods name %s; the doc says %s", arg, got, want)
	}
}
