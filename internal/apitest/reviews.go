package apitest

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
)

// The review APIs a token-checking server (package kubeauth) calls.
const (
	tokenReviewsPath         = "/apis/authentication.k8s.io/v1/tokenreviews"
	subjectAccessReviewsPath = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
)

// review is the part of a TokenReview or SubjectAccessReview the server reads and writes.
type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Token                 string `json:"token,omitempty"`
		User                  string `json:"user,omitempty"`
		NonResourceAttributes *struct {
			Path string `json:"path"`
			Verb string `json:"verb"`
		} `json:"nonResourceAttributes,omitempty"`
	} `json:"spec"`
	Status map[string]any `json:"status"`
}

// tokenReview answers a TokenReview: authenticated when Options.Users knows the token.
func (s *Server) tokenReview(w http.ResponseWriter, r *http.Request) {
	var rv review
	if !decodeReview(w, r, &rv, "TokenReview") {
		return
	}
	if u, ok := s.opts.Users[rv.Spec.Token]; ok {
		rv.Status = map[string]any{"authenticated": true, "user": map[string]any{
			"username": u, "uid": u + "-uid", "groups": []string{"system:authenticated"}}}
	} else {
		rv.Status = map[string]any{"authenticated": false, "error": "invalid bearer token"}
	}
	rv.Spec.Token = ""
	writeReview(w, &rv)
}

// subjectAccessReview answers a SubjectAccessReview of a non-resource URL: allowed when
// Options.Allowed gives the user "get" on the path.
func (s *Server) subjectAccessReview(w http.ResponseWriter, r *http.Request) {
	var rv review
	if !decodeReview(w, r, &rv, "SubjectAccessReview") {
		return
	}
	nr := rv.Spec.NonResourceAttributes
	allowed := nr != nil && nr.Verb == "get" && slices.Contains(s.opts.Allowed[rv.Spec.User], nr.Path)
	rv.Status = map[string]any{"allowed": allowed}
	writeReview(w, &rv)
}

func decodeReview(w http.ResponseWriter, r *http.Request, rv *review, kind string) bool {
	if r.Method != http.MethodPost {
		writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "the server does not allow this method on the requested resource")
		return false
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(rv); err != nil || rv.Kind != kind {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "not a "+kind)
		return false
	}
	return true
}

func writeReview(w http.ResponseWriter, rv *review) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(rv)
}
